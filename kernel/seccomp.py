"""The seccomp filter a local job runs under when the platform is root (no Django here).

Bubblewrap loads it (`--seccomp FD`: a classic BPF program, an array of `struct sock_filter`) right before it
runs the job's command. In root mode the job is a plain uid of the host's own user namespace, so without this
it could make a user namespace of its own (where it is root over its own mounts and network: the first step of
most kernel privilege escalations). The filter answers EPERM to:

- `unshare` and `clone` asking for a new user namespace (CLONE_NEWUSER), and `clone3` with ENOSYS (its flags
  sit in memory a filter cannot read; C libraries then fall back to `clone`);
- the kernel keyring (`keyctl`, `add_key`, `request_key`: not namespaced), `bpf`, `perf_event_open`,
  `userfaultfd` and io_uring (the usual paths of kernel exploits), module and kexec loading, mounting, and
  `open_by_handle_at` (opening host files by handle);
- every system call of another ABI than the machine's own (32-bit `int 0x80` and x32 on x86-64), which would
  otherwise pass under other numbers.

Everything else is allowed: the filter narrows what a job's uid could already reach; it is not the sandbox.
"""

from __future__ import annotations

import errno
import platform
import struct

# Classic BPF opcodes (linux/filter.h, linux/bpf_common.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

_ARCHES = {
    "x86_64": 0xC000003E,
    "aarch64": 0xC00000B7,
}

# name -> number, per machine (asm/unistd_64.h; asm-generic/unistd.h for arm64)
_SYSCALLS = {
    "x86_64": {
        "unshare": 272, "clone": 56, "clone3": 435, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "mount": 165, "umount2": 166, "pivot_root": 155,
        "open_by_handle_at": 304, "fsopen": 430, "fsmount": 432, "move_mount": 429, "open_tree": 428,
        "mount_setattr": 442,
    },
    "aarch64": {
        "unshare": 97, "clone": 220, "clone3": 435, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "mount": 40, "umount2": 39, "pivot_root": 41,
        "open_by_handle_at": 265, "fsopen": 430, "fsmount": 432, "move_mount": 429, "open_tree": 428,
        "mount_setattr": 442,
    },
}  # fmt: skip

DENIED = tuple(name for name in _SYSCALLS["x86_64"] if name not in {"unshare", "clone", "clone3"})


class SeccompUnsupported(RuntimeError):
    """No filter is written for this machine's architecture."""


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter for `machine` (this one by default), as bubblewrap's --seccomp reads it."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise SeccompUnsupported(f"no seccomp filter is written for {machine}")
    numbers = _SYSCALLS[machine]
    eperm = RET_ERRNO | errno.EPERM
    out = [_insn(_LD_W_ABS, _ARCH), _insn(_JEQ_K, _ARCHES[machine], jt=1), _insn(_RET_K, eperm)]
    out.append(_insn(_LD_W_ABS, _NR))
    if machine == "x86_64":
        out += [_insn(_JGE_K, X32_SYSCALL_BIT, jf=1), _insn(_RET_K, eperm)]
    for name in DENIED:
        out += [_insn(_JEQ_K, numbers[name], jf=1), _insn(_RET_K, eperm)]
    out += [_insn(_JEQ_K, numbers["clone3"], jf=1), _insn(_RET_K, RET_ERRNO | errno.ENOSYS)]
    for name in ("unshare", "clone"):
        # nr matches: load the flags' low word; CLONE_NEWUSER set -> EPERM, else allow (A no longer holds nr).
        out += [
            _insn(_JEQ_K, numbers[name], jf=4),
            _insn(_LD_W_ABS, _ARG0_LOW),
            _insn(_JSET_K, CLONE_NEWUSER, jf=1),
            _insn(_RET_K, eperm),
            _insn(_RET_K, RET_ALLOW),
        ]
    out.append(_insn(_RET_K, RET_ALLOW))
    return b"".join(out)
