/* Attribute reads and writes of the native paths, with a guarded cache per attribute name (issue 23, session 38).
 *
 * Theory of operation. The C paths read and write the Python objects' fields on every event (the Python objects
 * own the state; C keeps no copy of it). A generic PyObject_GetAttr looks the name up along the type's MRO (the
 * interpreter's method cache), dispatches on what it finds, then looks in the instance's dict: most of a C path's
 * time in libpython. An AttrName remembers, for the last two exact types it met, where the attribute lives:
 *
 *   ATTR_SLOT     a __slots__ member: the type's lookup finds a member descriptor of type T_OBJECT_EX without
 *                 flags, of a class the type derives from: the PyObject* at its offset in the object;
 *   ATTR_DICT     an instance-dict attribute: the lookup finds nothing in the type or any base (so no descriptor,
 *                 data or not, can take precedence) and the type's instances have a dict: that dict's entry;
 *   ATTR_GENERIC  anything else (a class attribute, a property, a member of another kind, no instance dict):
 *                 PyObject_GetAttr / PyObject_SetAttr, as before.
 *
 * An entry is used only for an object of exactly its type whose tp_version_tag is the one it was made under, non-
 * zero, with Py_TPFLAGS_VALID_VERSION_TAG set. CPython gives tags from a counter that never reuses one and
 * invalidates a type's tag (and its subclasses') whenever an attribute of the type or a base is set or deleted,
 * or its bases change (PyType_Modified): exactly what could change the lookup's answer, or tp_getattro /
 * tp_setattro (which change only through type attributes). The fast path is taken for reads only when the type's
 * tp_getattro is PyObject_GenericGetAttr, for writes only when its tp_setattro is PyObject_GenericSetAttr.
 *
 * What stays Python's: a slot that is empty on read, or an attribute not in the dict, goes to PyObject_GetAttr,
 * which raises the same AttributeError it always did. A dict write is PyDict_SetItem on the object's current dict
 * (asked for each time with PyObject_GenericGetDict, so a replaced __dict__ is seen; on CPython 3.11 it turns
 * a managed dict's inline values into a dict object once: the same attributes, kept in a dict). A slot write
 * stores the new reference before letting the old one go, as the member descriptor does.
 *
 * The type pointer in an entry is borrowed: it is only compared, and only together with a tag no other type can
 * carry. The GIL is held throughout and nothing between the check and the use runs Python code. */
#ifndef AMBIT_ATTR_CACHE_H
#define AMBIT_ATTR_CACHE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

enum { ATTR_GENERIC, ATTR_SLOT, ATTR_DICT };
#define ATTR_WAYS 2 /* exact types remembered per name: a name read on two kinds of object does not thrash */

typedef struct {
    PyTypeObject *type;   /* borrowed, only compared (see above) */
    unsigned int version; /* its tp_version_tag when filled, never 0 */
    unsigned char kind;   /* ATTR_* */
    unsigned char reads;  /* kind applies to reads: tp_getattro is the generic one */
    unsigned char writes; /* kind applies to writes: tp_setattro is the generic one */
    Py_ssize_t offset;    /* ATTR_SLOT: the member's offset in the object */
} AttrWay;

typedef struct {
    PyObject *name; /* interned once at module init */
    AttrWay ways[ATTR_WAYS];
    unsigned char next; /* the way the next fill replaces */
} AttrName;

/* The entry for tp, filled on a miss; NULL when tp has no valid version tag (the generic path then). */
static inline AttrWay *attr_way(AttrName *attr, PyTypeObject *tp)
{
    if (PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag != 0)
        for (int i = 0; i < ATTR_WAYS; i++)
            if (attr->ways[i].type == tp && attr->ways[i].version == tp->tp_version_tag)
                return &attr->ways[i];
    /* The lookup gives the type a version tag if it has none; what it finds holds as long as that tag does. */
    PyObject *found = _PyType_Lookup(tp, attr->name);
    unsigned int version = tp->tp_version_tag;
    if (!PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG) || version == 0)
        return NULL;
    unsigned char kind = ATTR_GENERIC;
    Py_ssize_t offset = 0;
    if (found == NULL) {
        if (tp->tp_dictoffset != 0 || PyType_HasFeature(tp, Py_TPFLAGS_MANAGED_DICT))
            kind = ATTR_DICT;
    } else if (Py_IS_TYPE(found, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)found)->d_member;
        /* T_OBJECT_EX with no READONLY or PY_AUDIT_READ flag is what __slots__ makes; a member descriptor of an
         * unrelated class (copied onto this one) raises TypeError in Python: the generic path keeps that. */
        if (member->type == T_OBJECT_EX && member->flags == 0 && member->offset > 0 &&
            PyType_IsSubtype(tp, PyDescr_TYPE(found))) {
            kind = ATTR_SLOT;
            offset = member->offset;
        }
    }
    AttrWay *way = &attr->ways[attr->next];
    attr->next = (unsigned char)((attr->next + 1) % ATTR_WAYS);
    *way = (AttrWay){
        .type = tp,
        .version = version,
        .kind = kind,
        .reads = tp->tp_getattro == PyObject_GenericGetAttr,
        .writes = tp->tp_setattro == PyObject_GenericSetAttr,
        .offset = offset,
    };
    return way;
}

/* obj.<name>: a new reference, or NULL with the exception Python's getattr would raise. */
static inline PyObject *attr_get(PyObject *obj, AttrName *attr)
{
    AttrWay *way = attr_way(attr, Py_TYPE(obj));
    if (way != NULL && way->reads) {
        if (way->kind == ATTR_SLOT) {
            PyObject *value = *(PyObject **)((char *)obj + way->offset);
            if (value != NULL)
                return Py_NewRef(value);
        } else if (way->kind == ATTR_DICT) {
            PyObject *dict = PyObject_GenericGetDict(obj, NULL);
            if (dict == NULL)
                return NULL;
            PyObject *value = PyDict_GetItemWithError(dict, attr->name);
            Py_XINCREF(value);
            Py_DECREF(dict);
            if (value != NULL || PyErr_Occurred())
                return value;
        }
    }
    return PyObject_GetAttr(obj, attr->name);
}

/* obj.<name> = value: 0, or -1 with the exception Python's setattr would raise. */
static inline int attr_set(PyObject *obj, AttrName *attr, PyObject *value)
{
    AttrWay *way = attr_way(attr, Py_TYPE(obj));
    if (way != NULL && way->writes) {
        if (way->kind == ATTR_SLOT) {
            PyObject **field = (PyObject **)((char *)obj + way->offset);
            PyObject *old = *field;
            *field = Py_NewRef(value);
            Py_XDECREF(old); /* last: it may run a finaliser */
            return 0;
        }
        if (way->kind == ATTR_DICT) {
            PyObject *dict = PyObject_GenericGetDict(obj, NULL);
            if (dict == NULL)
                return -1;
            int result = PyDict_SetItem(dict, attr->name, value);
            Py_DECREF(dict);
            return result;
        }
    }
    return PyObject_SetAttr(obj, attr->name, value);
}

/* An attribute as a C long: 0, or -1 with an exception set (none, not an int, or out of range). */
static inline int get_long(PyObject *obj, AttrName *attr, long *value)
{
    PyObject *item = attr_get(obj, attr);
    if (item == NULL)
        return -1;
    *value = PyLong_AsLong(item);
    Py_DECREF(item);
    return (*value == -1 && PyErr_Occurred()) ? -1 : 0;
}

static inline int set_long(PyObject *obj, AttrName *attr, long value)
{
    PyObject *item = PyLong_FromLong(value);
    if (item == NULL)
        return -1;
    int result = attr_set(obj, attr, item);
    Py_DECREF(item);
    return result;
}

/* An attribute's truth: 1, 0, or -1 with an exception set. */
static inline int get_true(PyObject *obj, AttrName *attr)
{
    PyObject *item = attr_get(obj, attr);
    if (item == NULL)
        return -1;
    int result = PyObject_IsTrue(item);
    Py_DECREF(item);
    return result;
}

/* Intern each name of a table once (module init): 0, or -1 with an exception set. */
typedef struct {
    AttrName *attr;
    const char *name;
} AttrNameInit;

static inline int attr_names_init(const AttrNameInit *names, size_t count)
{
    for (size_t i = 0; i < count; i++)
        if (names[i].attr->name == NULL && (names[i].attr->name = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    return 0;
}

#endif
