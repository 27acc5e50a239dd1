"""A distribution as pip installs it, for the plug-in tests: a NAME-VERSION.dist-info folder whose
entry_points.txt declares `entry_points` ({group: {name: "module:attribute"}}), found once `site` is on sys.path."""
from pathlib import Path


def write_dist_info(site: Path, name: str, entry_points: dict[str, dict[str, str]], version: str = "0.1") -> Path:
    """Write SITE/<name with '_' for '-'>-VERSION.dist-info (METADATA and entry_points.txt); returns `site`."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{ep} = {target}\n" for ep, target in eps.items())
        for group, eps in entry_points.items()))
    return site
