"""The sandbox an untrusted run executes in: bubblewrap (Debian's `bubblewrap`), when present.

A sandboxed run sees the system's read-only directories, its interpreter and environment (read-only),
the probe, the data directories the spec mounts (read-only), and, writable, only its run directory (which
holds its copy of the code); HOME and /tmp are private and empty. It cannot see the workspace
(`ladder.toml`, `baselines/`, `journals/`, other runs), the user's home (~/.ssh, ~/.aws, ~/.claude) or
other users' files. It gets its own PID namespace and dies with ladder: when ladder is killed, the
kernel kills every process of the run, including children that called setsid.

Must not: decide whether to sandbox (the profile does), or hide a missing sandbox: `resolve` says when
a run is not sandboxed, and the run records it.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ladder._util.errors import LadderError

SYSTEM_RO = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys")
DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri", "/dev/kfd", "/dev/accel*", "/dev/vfio", "/dev/infiniband")
PRIVATE_HOME = "/home/ladder-run"


@dataclass(frozen=True)
class Sandbox:
    """What one run may see: read-only paths, writable paths, and the working directory."""

    kind: str  # "bwrap" or "none"
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    notes: list[str] = field(default_factory=list)


@functools.lru_cache(maxsize=1)
def bwrap_works() -> str | None:
    """None when bubblewrap can make a sandbox here; else why not (missing, or the kernel forbids it)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "bubblewrap is not installed (Debian: apt-get install bubblewrap)"
    try:
        p = subprocess.run([exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
                            "--die-with-parent", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap failed to start: {e}"
    if p.returncode != 0:
        return f"bubblewrap cannot create a sandbox here: {p.stderr.strip()[:300]}"
    return None


def resolve(choice: str) -> tuple[str, str | None]:
    """The sandbox a profile's choice gives on this machine, and a warning when it is none."""
    if choice == "none":
        return "none", "sandbox = \"none\": the run can read and write everything ladder can (the workspace, ~/.ssh, ...)"
    why = bwrap_works()
    if why is None:
        return "bwrap", None
    if choice == "bwrap":
        raise LadderError(f"the profile asks for sandbox = \"bwrap\" but {why}",
                          "install bubblewrap, or set sandbox = \"none\" in the profile (the run is then not contained)")
    return "none", f"not sandboxed: {why}; the run can read and write everything ladder can"


def interpreter_paths(python: str) -> list[Path]:
    """The directories an interpreter needs: its environment and the installation it was created from."""
    out: list[Path] = []
    exe = Path(python)
    if not exe.is_absolute():
        found = shutil.which(python)
        exe = Path(found) if found else exe
    env_dir = exe.parent.parent
    out.append(env_dir.resolve() if env_dir.exists() else env_dir)
    out.append(env_dir)
    cfg = env_dir / "pyvenv.cfg"
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                base = Path(value.strip()).parent
                out += [base, base.resolve()]
    try:
        out.append(exe.resolve().parent.parent)
    except OSError:
        pass
    return out


def bwrap_argv(box: Sandbox, cwd: Path, env: dict[str, str]) -> list[str]:
    """The bubblewrap command line that runs a command in the box (the command follows it)."""
    argv = ["bwrap", "--unshare-pid", "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--tmpfs", "/home", "--dir", PRIVATE_HOME, "--setenv", "HOME", PRIVATE_HOME]
    for d in SYSTEM_RO:
        if os.path.exists(d):
            argv += ["--ro-bind", d, d]
    for pattern in DEVICES:  # accelerators: the run must compute where the profile says
        for dev in sorted(glob.glob(pattern)):
            argv += ["--dev-bind", dev, dev]
    seen: set[str] = set()
    for p in box.read_only:
        s = str(p)
        if s in seen or not os.path.exists(s) or any(s == d or s.startswith(d + "/") for d in SYSTEM_RO):
            continue
        seen.add(s)
        argv += ["--ro-bind", s, s]
    for p in box.writable:
        s = str(p)
        if s not in seen and os.path.exists(s):
            seen.add(s)
            argv += ["--bind", s, s]
    argv += ["--chdir", str(cwd)]
    for key in ("HOME", "TMPDIR"):
        env.pop(key, None)
    env["HOME"] = PRIVATE_HOME
    return argv + ["--"]
