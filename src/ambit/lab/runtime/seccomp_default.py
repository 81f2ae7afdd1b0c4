"""The lab's ``RuntimeDefault`` seccomp profile, as data (read by :mod:`ambit.lab.runtime.seccomp`).

It is equivalent in effect to the default profile of containerd and Docker: an allow-list whose default action is
``SCMP_ACT_ERRNO`` (EPERM). What it leaves out is what lets a process reach beyond its container: loading kernel
code (``init_module``, ``kexec_load``, ``bpf``), the kernel keyring (``keyctl``, ``add_key``), handles that open
any file of a filesystem (``open_by_handle_at``), ``userfaultfd``, ``perf_event_open``, swap, accounting, reboot and
the clock. Some calls are allowed only with the capability that would have made them useful anyway
(:data:`BY_CAPABILITY`): a container holding ``CAP_SYS_ADMIN`` (the node proxy, for ``setns``) may ``mount``,
``unshare`` and ``setns``; without it, ``clone`` may not make namespaces (:data:`CLONE_NAMESPACE_FLAGS`) and
``clone3``, whose flags a filter cannot read, fails with ENOSYS so that libc falls back to ``clone``.

``ptrace``, ``process_vm_readv`` and ``process_vm_writev`` are allowed, as containerd allows them on kernels from
4.8 on (where ptrace can no longer bypass the filter): a container's processes only see each other.

Names the machine's libseccomp does not know (other architectures' calls, very new ones) are ignored by runc.
"""

from __future__ import annotations

from collections.abc import Mapping

EPERM = 1
ENOSYS = 38

ALLOWED: tuple[str, ...] = (
    # files and directories
    "access", "chdir", "chmod", "chown", "chown32", "close", "close_range", "copy_file_range", "creat",
    "dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate", "fchdir",
    "fchmod", "fchmodat", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync", "flock",
    "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate", "ftruncate64",
    "futimesat", "getcwd", "getdents", "getdents64", "lchown", "lchown32", "link", "linkat", "_llseek",
    "lseek", "lstat", "lstat64", "mkdir", "mkdirat", "mknod", "mknodat", "newfstatat", "open", "openat",
    "openat2", "pread64", "preadv", "preadv2", "pwrite64", "pwritev", "pwritev2", "read", "readahead",
    "readlink", "readlinkat", "readv", "rename", "renameat", "renameat2", "rmdir", "sendfile", "sendfile64",
    "splice", "stat", "stat64", "statfs", "statfs64", "statx", "symlink", "symlinkat", "sync",
    "sync_file_range", "syncfs", "tee", "truncate", "truncate64", "umask", "unlink", "unlinkat", "utime",
    "utimensat", "utimensat_time64", "utimes", "vmsplice", "write", "writev", "name_to_handle_at",
    # extended attributes
    "fgetxattr", "flistxattr", "fremovexattr", "fsetxattr", "getxattr", "lgetxattr", "listxattr",
    "llistxattr", "lremovexattr", "lsetxattr", "removexattr", "setxattr",
    # waiting for descriptors, events and notifications
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2",
    "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "fanotify_mark", "inotify_add_watch",
    "inotify_init", "inotify_init1", "inotify_rm_watch", "_newselect", "pause", "pipe", "pipe2", "poll", "ppoll",
    "ppoll_time64", "pselect6", "pselect6_time64", "select", "signalfd", "signalfd4",
    "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64",
    # asynchronous I/O
    "io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "io_setup",
    "io_submit", "io_uring_enter", "io_uring_register", "io_uring_setup", "ioctl", "ioprio_get",
    "ioprio_set",
    # processes and threads
    "execve", "execveat", "exit", "exit_group", "fork", "vfork", "wait4", "waitid", "waitpid",
    "getpid", "getppid", "gettid", "getpgid", "getpgrp", "getsid", "setpgid", "setsid", "get_robust_list",
    "set_robust_list", "get_thread_area", "set_thread_area", "set_tid_address", "rseq", "restart_syscall",
    "prctl", "capget", "capset", "seccomp", "getrlimit", "setrlimit", "prlimit64", "ugetrlimit",
    "getrusage", "getpriority", "setpriority", "pidfd_open", "pidfd_send_signal", "process_mrelease",
    "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "membarrier",
    # user and group ids
    "getuid", "getuid32", "geteuid", "geteuid32", "getgid", "getgid32", "getegid", "getegid32",
    "getresuid", "getresuid32", "getresgid", "getresgid32", "getgroups", "getgroups32", "setuid",
    "setuid32", "setgid", "setgid32", "setreuid", "setreuid32", "setregid", "setregid32", "setresuid",
    "setresuid32", "setresgid", "setresgid32", "setfsuid", "setfsuid32", "setfsgid", "setfsgid32",
    "setgroups", "setgroups32",
    # memory
    "brk", "madvise", "memfd_create", "memfd_secret", "mincore", "mlock", "mlock2", "mlockall", "mmap",
    "mmap2", "mprotect", "mremap", "msync", "munlock", "munlockall", "munmap", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "remap_file_pages",
    # futexes and scheduling
    "futex", "futex_time64", "futex_waitv", "getcpu", "sched_getaffinity", "sched_getattr",
    "sched_getparam", "sched_get_priority_max", "sched_get_priority_min", "sched_getscheduler",
    "sched_rr_get_interval", "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr",
    "sched_setparam", "sched_setscheduler", "sched_yield",
    # signals
    "kill", "tkill", "tgkill", "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo",
    "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo",
    "sigaltstack", "sigprocmask", "sigreturn",
    # time (reading it, timers, sleeping; clock_adjtime and adjtimex only change it with CAP_SYS_TIME)
    "adjtimex", "alarm", "clock_adjtime", "clock_adjtime64", "clock_getres", "clock_getres_time64",
    "clock_gettime", "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64", "getitimer",
    "gettimeofday", "nanosleep", "setitimer", "time", "timer_create", "timer_delete", "timer_getoverrun",
    "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64", "times",
    # sockets (socket itself: see CONDITIONAL)
    "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt", "listen", "recv",
    "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "send", "sendmmsg", "sendmsg", "sendto",
    "setsockopt", "shutdown", "socketcall", "socketpair",
    # System V and POSIX IPC (in the container's own IPC namespace)
    "ipc", "msgctl", "msgget", "msgrcv", "msgsnd", "semctl", "semget", "semop", "semtimedop",
    "semtimedop_time64", "shmat", "shmctl", "shmdt", "shmget", "mq_getsetattr", "mq_notify", "mq_open",
    "mq_timedreceive", "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink",
    # the system
    "getrandom", "sysinfo", "uname",
    # another process of the container (kernels >= 4.8)
    "ptrace", "process_vm_readv", "process_vm_writev",
)  # fmt: skip
"""Allowed to every container."""

BY_ARCHITECTURE: Mapping[str, tuple[str, ...]] = {
    "x86_64": ("arch_prctl", "modify_ldt"),
    "aarch64": ("arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2", "breakpoint", "cacheflush", "set_tls"),
}
"""Allowed on one architecture (by ``platform.machine()``)."""

BY_CAPABILITY: Mapping[str, tuple[str, ...]] = {
    "CAP_SYS_ADMIN": (
        "bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick", "lookup_dcookie",
        "mount", "mount_setattr", "move_mount", "open_tree", "perf_event_open", "quotactl", "quotactl_fd",
        "setdomainname", "sethostname", "setns", "syslog", "umount", "umount2", "unshare",
    ),
    "CAP_DAC_READ_SEARCH": ("open_by_handle_at",),
    "CAP_SYS_BOOT": ("reboot",),
    "CAP_SYS_CHROOT": ("chroot",),
    "CAP_SYS_MODULE": ("delete_module", "init_module", "finit_module"),
    "CAP_SYS_PACCT": ("acct",),
    "CAP_SYS_PTRACE": ("kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace"),
    "CAP_SYS_RAWIO": ("iopl", "ioperm"),
    "CAP_SYS_TIME": ("settimeofday", "stime", "clock_settime", "clock_settime64"),
    "CAP_SYS_TTY_CONFIG": ("vhangup",),
    "CAP_SYS_NICE": ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"),
    "CAP_SYSLOG": ("syslog",),
    "CAP_BPF": ("bpf",),
    "CAP_PERFMON": ("perf_event_open",),
}  # fmt: skip
"""Allowed to a container whose bounding set holds the capability (the kernel still checks it)."""

CLONE_NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET."""

AF_VSOCK = 40
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
"""``personality``: PER_LINUX, PER_LINUX32, UNAME26 and their mix, and the query (0xffffffff) only."""

ARCHITECTURES: Mapping[str, tuple[str, ...]] = {
    "x86_64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "aarch64": ("SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"),
}
"""The filter's architectures by ``platform.machine()`` (the native one and its compatibility modes)."""
