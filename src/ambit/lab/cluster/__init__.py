"""The lab as a whole: ``ambit lab up`` and ``down`` (:mod:`.lifecycle`), the crash-safe record of what it created
(:mod:`.record`), the supervisor that keeps the mesh's daemons running (:mod:`.supervisor`), and the long-running
node and controllers processes ``lab up`` starts (:mod:`.node`).
"""
