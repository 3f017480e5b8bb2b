"""perf_analyzer, Triton's load generator, installed into a private folder of the checkout.

    python -m benchmarks.perf_analyzer_install      # install (or find) it; print the command

Where the C library is glibc 2.38 or newer (Ubuntu 24.04, Debian 13), `pip install
perf-analyzer==2.60.0` is all it takes, and a `perf_analyzer` on PATH that runs is used as it is.
Elsewhere pip quietly picks 0.1.0, an empty placeholder, because the real wheels are tagged
manylinux_2_38. Then this module downloads the 2.60.0 wheel for that platform into
`.bench-tools/`, and, if its binary does not start on this system's C library, Debian 13's libc6,
libstdc++6 and libgcc-s1 (`apt-get download` from a private apt folder listing Debian 13's
archive, signed with debian-archive-keyring's keys), and runs the binary through their dynamic
loader: the new C library serves perf_analyzer alone. Each step is skipped when its result is
already there; `command.json` records the command.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from benchmarks.harness import REPO, command_line

VERSION = "2.60.0"
CACHE = REPO / ".bench-tools" / f"perf_analyzer-{VERSION}"
PLATFORM = "manylinux_2_38_x86_64"
DEBIAN_SUITE = "trixie"  # Debian 13: glibc 2.41, libstdc++ of GCC 14
DEBIAN_PACKAGES = ("libc6", "libstdc++6", "libgcc-s1")
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-trixie-stable.gpg")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
SYSTEM_LIBS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")


def _runs(command: list[str]) -> bool:
    """Whether `command --version` starts and says it is perf_analyzer (not the empty placeholder)."""
    try:
        done = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and "Perf Analyzer" in done.stdout + done.stderr


def _binary(cache: Path) -> Path:
    """The wheel's binary, downloaded and unpacked once."""
    binary = cache / "wheel" / "perf_analyzer" / "bin" / "perf_analyzer"
    if binary.exists():
        return binary
    download = cache / "download"
    download.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform", PLATFORM]
        + ["--python-version", "3.11", "-d", str(download), f"perf-analyzer=={VERSION}"],
        check=True,
    )
    (wheel,) = download.glob(f"perf_analyzer-{VERSION}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(cache / "wheel")
    binary.chmod(0o755)
    return binary


def _apt_options(apt: Path) -> list[str]:
    """apt-get options that read and write only `apt/`: its own source list, lists, cache and status."""
    parts = apt / "parts"
    return [
        *("-o", f"Dir::Etc::sourcelist={apt / 'sources.list'}", "-o", f"Dir::Cache={apt / 'cache'}"),
        *("-o", f"Dir::Etc::sourceparts={parts}", "-o", f"Dir::Etc::preferencesparts={parts}"),
        *("-o", f"Dir::State::Lists={apt / 'lists'}", "-o", f"Dir::State::status={apt / 'status'}"),
        *("-o", "Debug::NoLocking=1", "-o", "APT::Architecture=amd64", "-o", "APT::Sandbox::User=root"),
    ]


def _glibc(cache: Path) -> Path:
    """Debian 13's C and C++ runtime libraries unpacked into `cache/glibc` once; their lib folder."""
    root = cache / "glibc"
    libdir = root / "usr" / "lib" / "x86_64-linux-gnu"
    if (libdir / "libc.so.6").exists() and (libdir / "libstdc++.so.6").exists():
        return libdir
    if shutil.which("apt-get") is None or not DEBIAN_KEYRING.exists():
        raise SystemExit(
            "perf_analyzer needs glibc 2.38; this system has an older one and no apt-get with Debian's "
            "keys to fetch a private copy: run the benchmark on Ubuntu 24.04 or Debian 13 "
            f"(pip install perf-analyzer=={VERSION})"
        )
    apt, debs = cache / "apt", cache / "debs"
    for folder in (apt / "lists" / "partial", apt / "cache" / "archives" / "partial", apt / "parts", debs):
        folder.mkdir(parents=True, exist_ok=True)
    (apt / "status").touch()
    (apt / "sources.list").write_text(
        f"deb [signed-by={DEBIAN_KEYRING}] {DEBIAN_MIRROR} {DEBIAN_SUITE} main\n"
    )
    options = _apt_options(apt)
    subprocess.run(["apt-get", *options, "update"], check=True)
    subprocess.run(["apt-get", *options, "download", *DEBIAN_PACKAGES], check=True, cwd=debs)
    for deb in sorted(debs.glob("*.deb")):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    return libdir


def perf_analyzer_command(cache: Path = CACHE) -> list[str]:
    """The command that runs perf_analyzer here, installing what it needs the first time."""
    recorded = cache / "command.json"
    if recorded.exists():
        command = json.loads(recorded.read_text())
        if _runs(command):
            return command
    on_path = shutil.which("perf_analyzer")
    if on_path is not None and _runs([on_path]):
        return [on_path]
    binary = _binary(cache)
    command = [str(binary)]
    if not _runs(command):
        libdir = _glibc(cache)
        library_path = ":".join([str(libdir), *SYSTEM_LIBS])
        command = [str(libdir / "ld-linux-x86-64.so.2"), "--library-path", library_path, str(binary)]
        if not _runs(command):
            raise SystemExit(f"perf_analyzer does not start, not even through {libdir}: {' '.join(command)}")
    recorded.write_text(json.dumps(command))
    return command


def main(argv: list[str] | None = None) -> None:
    parser = command_line(__doc__)
    parser.add_argument("--cache", type=Path, default=CACHE, help="install folder")
    args = parser.parse_args(argv)
    print(" ".join(perf_analyzer_command(args.cache)))


if __name__ == "__main__":
    main()
