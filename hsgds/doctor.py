"""The ``hsgds doctor`` report: what :func:`~hsgds.probe.probe` found, what :func:`~hsgds.choice.choose`
would pick and why, and what that path means on this platform (WSL2, native Windows, Linux) and for
where a store lives."""

from __future__ import annotations

import os

from hsgds.choice import Choice, choose
from hsgds.errors import DependencyError, HsgdsError
from hsgds.probe import DeviceReport

__all__ = ["NO_MAIN_GUARD", "WINDOWS_DRIVE_FS", "cpu_cut_status", "doctor_report", "mount_of", "platform_notes"]

#: Filesystems through which WSL2 reaches Windows drives (/mnt/c ...): every read crosses the VM boundary.
WINDOWS_DRIVE_FS = ("9p", "v9fs", "drvfs")
NO_MAIN_GUARD = ('no worker processes (threads only): training scripts need no `if __name__ == "__main__":` '
                 "guard, on Windows or anywhere else")


def mount_of(path: str | os.PathLike, mounts: str | None = None) -> tuple[str, str] | None:
    """(mount point, filesystem type) of the mount holding ``path``, from ``/proc/mounts`` (or the given
    text in its format); None where that is not available (not Linux)."""
    if mounts is None:
        try:
            with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
                mounts = f.read()
        except OSError:
            return None
    target = os.path.abspath(os.fspath(path))
    best: tuple[str, str] | None = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, parts[2])
    return best


def platform_notes(report: DeviceReport, choice: Choice | None, store: str | os.PathLike | None = None,
                   mounts: str | None = None) -> list[str]:
    """What the chosen path means on this platform (WSL2, native Windows, Linux), and where ``store`` is."""
    notes: list[str] = []
    reader = choice.reader if choice is not None else None
    on_gpu = choice is not None and choice.kind == "cuda"
    if report.windows:
        notes.append("native Windows: kvikio and DALI are Linux-only, so hsgds reads with POSIX reads into "
                     "pinned host memory + copies to the GPU (posix-pinned) and cuts patches with the torch "
                     "engine; run under WSL2 to use kvikio")
    elif report.wsl:
        if reader == "kvikio":
            notes.append("WSL2: kvikio in compat mode (WSL2 has no GPUDirect Storage): POSIX reads + "
                         "host-to-device copies through kvikio's pinned bounce buffers")
        elif on_gpu:
            notes.append(f"WSL2: reader {reader}: POSIX reads into pinned host memory + copies to the GPU "
                         "(WSL2 has no GPUDirect Storage)")
        else:
            notes.append("WSL2: the CPU path (POSIX reads, torch engine on the CPU)")
        notes.append("WSL2: keep stores on the WSL ext4 disk (e.g. ~/data), not under /mnt/c: Windows drives "
                     "are reached over 9P, many times slower")
        if on_gpu:
            notes.append("WSL2: pinned host memory is limited (it comes out of the WSL VM's memory, half of the "
                         "host's RAM by default; .wslconfig memory=); keep kvikio_threads modest")
    elif on_gpu and reader == "kvikio":
        notes.append("Linux: " + ("GPUDirect Storage: cuFile DMA from NVMe into device memory" if report.gds
                                  else "kvikio compat mode: POSIX reads + host-to-device copies"))
    if report.windows or report.wsl:
        notes.append(NO_MAIN_GUARD)
    if store is not None:
        where = mount_of(store, mounts)
        if where is None:
            notes.append(f"store {store}: filesystem unknown")
        else:
            point, fstype = where
            notes.append(f"store {store}: on {fstype} (mounted at {point})")
            if report.wsl and (fstype in WINDOWS_DRIVE_FS or
                               os.path.abspath(os.fspath(store)).startswith("/mnt/")
                               and fstype not in ("ext4", "xfs", "btrfs")):
                notes.append(f"WARNING: store {store} is on a Windows drive ({fstype}); copy it to the WSL "
                             "ext4 disk (e.g. ~/data) for full speed")
            elif fstype in ("overlay", "tmpfs"):
                notes.append(f"WARNING: store {store} is on {fstype}; in a container, mount the NVMe data "
                             "volume and keep stores there (docker/README.md)")
            elif report.gds and fstype not in ("ext4", "xfs"):
                notes.append(f"note: GPUDirect Storage reads local NVMe through ext4 or xfs; on {fstype} "
                             "cuFile may fall back to its compat mode")
    return notes

def _status(ok: bool, detail: str, reason: str) -> str:
    return f"yes  {detail}".rstrip() if ok else f"no   {detail + ': ' if detail else ''}{reason}"


def cpu_cut_status() -> str:
    """The doctor's line on the fused CPU cut (:mod:`hsgds.engines.cpu_cut`), which the torch engine uses
    on the CPU: whether it runs here and why not, numba's version, where compiled kernels are kept.
    Imports numba (~1-2 s)."""
    from hsgds import defaults

    try:
        from hsgds.engines import cpu_cut
    except DependencyError as exc:  # a base install without torch: the rest of the report still stands
        return _status(False, "", str(exc))
    if not defaults.get("numba"):
        return _status(False, "", "setting numba is off (HSGDS_NUMBA=false): torch ops cut on the CPU")
    if not cpu_cut.available():
        return _status(False, "", f"torch ops cut on the CPU: {cpu_cut.unavailable_reason()}")
    import numba

    folder = cpu_cut.cache_folder() or "numba's cache folder"
    return _status(True, f"numba {numba.__version__}, compiled once per store dtype and output dtype (seconds), "
                         f"kept in {folder}", "")


def doctor_report(report: DeviceReport, choice: Choice | None = None, *, reader: str = "auto",
                  engine: str = "auto", store: str | os.PathLike | None = None, cpu_cut: str | None = None) -> str:
    """A human-readable report of what this machine can use and what hsgds would pick, with reasons,
    and what that path means on this platform (:func:`platform_notes`; ``store``: where it lives;
    ``cpu_cut``: the line of :func:`cpu_cut_status`, left out when None).

    ``choice`` defaults to ``choose(report, reader, engine)``; if that raises, the error is shown.
    """
    os_line = report.platform or "?"
    if report.wsl:
        os_line += " (WSL2)"
    elif report.windows:
        os_line += " (native Windows)"
    torch_line = (f"{report.torch_version} (built for CUDA {report.cuda_runtime or 'none: CPU-only'})"
                  if report.torch_version else "not importable")
    gpu = ""
    if report.cuda:
        gpu = (f"{report.device_name} x{report.device_count}, compute {report.compute_capability}, "
               f"driver CUDA {report.cuda_driver or '?'}")
    gds_detail = f"compat_mode={report.compat_mode}" if report.compat_mode else ""
    lines = [
        "hsgds doctor",
        f"  system        {os_line}, Python {report.python or '?'}",
        f"  HSGDS_DEVICE  {report.device_setting}{' (forces the CPU path)' if report.forced_cpu else ''}",
        f"  torch         {torch_line}",
        f"  CUDA          {_status(report.cuda, gpu, report.cuda_reason)}",
        f"  kvikio        {_status(report.kvikio_usable, report.kvikio_version or '', report.kvikio_reason)}",
        f"  GDS           {_status(report.gds, gds_detail, report.gds_reason)}",
        f"  DALI (GPU)    {_status(report.dali_gpu, report.dali_version or '', report.dali_reason)}",
    ]
    if cpu_cut is not None:
        lines.append(f"  CPU cut       {cpu_cut}")
    if report.probe_error:
        lines.append(f"  probe error   {report.probe_error}")
    if choice is None:
        try:
            choice = choose(report, reader, engine)
        except HsgdsError as exc:
            lines += ["", f"  cannot choose: {exc}"]
            notes = platform_notes(report, None, store)
            return "\n".join(lines + (["", "path:"] + [f"  - {n}" for n in notes] if notes else [])) + "\n"
    lines += ["", f"would use: device={choice.device} reader={choice.reader} engine={choice.engine}"]
    lines += [f"  - {r}" for r in choice.reasons]
    if choice.reader == "kvikio":
        lines.append(f"  - reader stats will show {'kvikio-gds' if report.gds else 'kvikio-compat'}")
    notes = platform_notes(report, choice, store)
    if notes:
        lines += ["", "path:"] + [f"  - {n}" for n in notes]
    return "\n".join(lines) + "\n"
