"""The mirror's wheel downloads: one copy per wheel on disk, whatever request fetched it, one
download of a wheel every Python shares, and a pip failure that says why (a full disk by name)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import threading
import zipfile
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from extforge.mirror.inputs import from_pip, pip_failure, share_wheels
from pythons import python_or_skip


def _wheel(folder: Path, name: str, body: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(body)
    return path


def _digests(folder: Path) -> dict[str, str]:
    """What a download's record says of its wheels: each one's sha256."""
    return {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in folder.glob("*.whl")}


def test_requests_sharing_wheels_keep_one_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "store"
    big = os.urandom(1 << 20)
    # torch alone, then torch with extras: the same nvidia wheel downloaded twice.
    first = _wheel(tmp_path / "torch", "nvidia_x-1.0-py3-none-any.whl", big)
    second = _wheel(tmp_path / "torch+extras", "nvidia_x-1.0-py3-none-any.whl", big)
    extra = _wheel(tmp_path / "torch+extras", "einops-0.8-py3-none-any.whl", b"einops")
    assert share_wheels(first.parent, store, _digests(first.parent)) == 0
    assert share_wheels(second.parent, store, _digests(second.parent)) == len(big)
    assert first.stat().st_ino == second.stat().st_ino and second.read_bytes() == big
    assert extra.stat().st_nlink == 2  # kept in the store for the next request
    # Run again: nothing left to share.
    assert share_wheels(second.parent, store, _digests(second.parent)) == 0


def test_a_same_named_wheel_with_other_bytes_stays_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "store"
    a = _wheel(tmp_path / "a", "pkg-1.0-py3-none-any.whl", b"one build")
    b = _wheel(tmp_path / "b", "pkg-1.0-py3-none-any.whl", b"a rebuilt wheel, same name")
    share_wheels(a.parent, store, _digests(a.parent))
    assert share_wheels(b.parent, store, _digests(b.parent)) == 0
    assert a.stat().st_ino != b.stat().st_ino and b.read_bytes() == b"a rebuilt wheel, same name"
    assert len(list(store.iterdir())) == 2


def test_a_full_disk_is_named(tmp_path: Path) -> None:
    stderr = ("ERROR: Exception:\nTraceback (most recent call last):\n  File \"shutil.py\", line 825, in move\n"
              "OSError: [Errno 28] No space left on device: '/tmp/pip-unpack-x/nvidia_cusolver_cu12-11.7.3.90-py3-none-"
              "manylinux_2_27_x86_64.whl' -> '/cache/mirror/wheels/6205/nvidia_cusolver_cu12-11.7.3.90-py3-none-"
              "manylinux_2_27_x86_64.whl'\n")
    err = pip_failure(stderr, tmp_path)
    assert err.what.startswith("the disk is full") and "GiB free" in err.what
    assert "No space left on device" in err.why
    other = pip_failure("ERROR: No matching distribution found for torch==9.9\n", tmp_path)
    assert other.what == "pip could not download the wheels to mirror" and "torch==9.9" in other.why


def _dist(index: Path, project: str, version: str, tag: str = "py3-none-any", requires: tuple[str, ...] = ()) -> str:
    stem = f"{project.replace('-', '_')}-{version}"
    with zipfile.ZipFile(index / f"{stem}-{tag}.whl", "w") as zf:
        zf.writestr(f"{stem}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n"
                    + "".join(f"Requires-Dist: {r}\n" for r in requires))
        zf.writestr(f"{stem}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n")
        zf.writestr(f"{stem}.dist-info/RECORD", "")
    return f"{stem}-{tag}.whl"


class _Index(http.server.SimpleHTTPRequestHandler):
    """A links page with each wheel's sha256, as a package index gives it; counts the wheels sent."""

    sent: Counter[str] = Counter()

    def do_GET(self) -> None:
        if self.path.endswith(".whl"):
            self.sent[self.path.rsplit("/", 1)[-1]] += 1
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, list[str]]]:
    folder = tmp_path / "index"
    folder.mkdir()
    # torch's shape: an any-python dependency pinned exactly, one whose newer releases need a newer
    # Python, and one built per CPython.
    _dist(folder, "xf-root", "1.0", requires=("xf-shared==1.0", "xf-dep", "xf-native"))
    _dist(folder, "xf-shared", "1.0")
    _dist(folder, "xf-dep", "1.0")
    _dist(folder, "xf-dep", "2.0")
    for cp in ("cp310", "cp312"):
        _dist(folder, "xf-native", "1.0", tag=f"{cp}-none-any")
    monkeypatch.setenv("EXTFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's pip settings (other indexes) stay out
    for name in [n for n in os.environ if n.startswith("PIP_") and n != "PIP_CONFIG_FILE"]:
        monkeypatch.delenv(name)
    _Index.sent = Counter()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Index, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield folder, ["xf-root==1.0", "--no-index", "--find-links", f"http://127.0.0.1:{server.server_port}/links.html"]
    finally:
        server.shutdown()


def _publish(folder: Path, requires_python: dict[str, str], *, hashes: bool = True) -> None:
    """links.html of the folder's wheels; without hashes, as a plain find-links page gives them."""
    links = []
    for wheel in sorted(folder.glob("*.whl")):
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        rp = requires_python.get(wheel.name, "")
        href = f"{wheel.name}#sha256={sha}" if hashes else wheel.name
        links.append(f'<a href="{href}"{f" data-requires-python={rp!r}" if rp else ""}>{wheel.name}</a>')
    (folder / "links.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")


def test_a_wheel_every_python_shares_is_downloaded_once(index: tuple[Path, list[str]]) -> None:
    folder, request = index
    dep2 = "xf_dep-2.0-py3-none-any.whl"
    _publish(folder, {dep2: "&gt;=3.11"})
    py312, py310 = python_or_skip("3.12"), python_or_skip("3.10")
    newer = from_pip(request, py312)
    assert set(newer.artifacts) == {"xf-root", "xf-shared", "xf-dep", "xf-native"}
    assert newer.artifacts["xf-dep"].version == "2.0"
    older = from_pip(request, py310)
    # The any-python wheels came from the 3.12 download; the one for cp310, and the release of
    # xf-dep that 3.10 can install, from the index.
    assert _Index.sent == Counter({"xf_root-1.0-py3-none-any.whl": 1, "xf_shared-1.0-py3-none-any.whl": 1,
                                   dep2: 1, "xf_dep-1.0-py3-none-any.whl": 1,
                                   "xf_native-1.0-cp312-none-any.whl": 1, "xf_native-1.0-cp310-none-any.whl": 1})
    assert {a.name: a.version for a in older.artifacts.values()} == {
        "xf-root": "1.0", "xf-shared": "1.0", "xf-dep": "1.0", "xf-native": "1.0"}
    downloaded = sorted(p.name for p in older.artifacts["xf-root"].wheel.parent.glob("*.whl"))
    assert dep2 not in downloaded and "xf_native-1.0-cp310-none-any.whl" in downloaded


def test_a_lent_wheel_the_index_does_not_vouch_for_is_downloaded_again(index: tuple[Path, list[str]]) -> None:
    folder, request = index
    _publish(folder, {})
    first = from_pip(request, python_or_skip("3.12"))
    kept = first.artifacts["xf-shared"].wheel
    kept.unlink()  # the copy a later request would borrow, altered: the store's link is left alone
    kept.write_bytes(b"not the index's wheel")
    second = from_pip(request, python_or_skip("3.10"))
    assert _Index.sent["xf_shared-1.0-py3-none-any.whl"] == 2
    assert second.artifacts["xf-shared"].wheel.read_bytes() == (folder / "xf_shared-1.0-py3-none-any.whl").read_bytes()


def _forged(original: Path, dest: Path) -> Path:
    """The wheel with a module added: same name, other bytes, as a co-tenant would make it."""
    dest.mkdir(exist_ok=True)
    forged = dest / original.name
    forged.write_bytes(original.read_bytes())
    with zipfile.ZipFile(forged, "a") as zf:
        zf.writestr("xf_shared/evil.py", "import os; os.system('id > /tmp/owned')\n")
    forged.chmod(0o644)
    return forged


@pytest.mark.parametrize("plant", ["sibling download", "wheel store", "own request folder"])
def test_a_wheel_another_user_planted_in_a_shared_cache_is_never_mirrored(index, peer_site, monkeypatch, plant):
    """With a find-links page that gives no hashes (pip then takes any file already in its folder),
    a member of the cache's group plants a forged wheel where root's mirror looked for its own: a
    complete download of the same request for another Python (request.json and .complete beside
    it), the store entry under the real wheel's sha256, or the very folder of root's request. The
    old code lent the first, linked the second over the wheel pip had just fetched, and took the
    third as complete: root's channel got the forged wheel. The next code refused the third for
    good ("refusing to use ...: it is owned by extforge-peer"). Now root's mirror folder in a cache
    root others may write is root's own (paths.own_area): it mirrors the genuine wheel each time."""
    from extforge.mirror.inputs import pip_wheel_dir

    folder, request = index
    _publish(folder, {}, hashes=False)
    genuine = folder / "xf_shared-1.0-py3-none-any.whl"
    forged = _forged(genuine, peer_site.root / f"forged-{plant.replace(' ', '-')}")
    cache = peer_site.shared_folder(f"wheel-cache-{plant.replace(' ', '-')}")  # root:extforge-site 2775
    monkeypatch.setenv("EXTFORGE_CACHE", str(cache))
    py310 = python_or_skip("3.10")
    target = {
        "sibling download": cache / "mirror" / "wheels" / "0123456789abcdef",
        "wheel store": cache / "mirror" / "wheel-store" / hashlib.sha256(genuine.read_bytes()).hexdigest(),
        "own request folder": cache / "mirror" / "wheels" / pip_wheel_dir(request, "3.10").name,
    }[plant]
    request_json = json.dumps({"python": "3.12", "requirements": sorted(request)})
    script = (f"umask 002 && mkdir -p {target} && cp {forged} {target}/ && mkdir -p {cache}/mirror/wheels "
              f"&& printf '%s' '{request_json}' > {target}/request.json && touch {target}/.complete")
    peer = peer_site.peers[0]
    subprocess.run(["setpriv", f"--reuid={peer.uid}", f"--regid={peer.gid}", "--init-groups", "--inh-caps=-all", "--",
                    "sh", "-c", script], check=True, cwd="/")
    assert target.stat().st_uid == peer.uid

    inputs = from_pip(request, py310)
    assert inputs.artifacts["xf-shared"].wheel.read_bytes() == genuine.read_bytes()
    assert _Index.sent["xf_shared-1.0-py3-none-any.whl"] == 1
    assert forged.read_bytes() == (target / forged.name).read_bytes()  # the planted copy is left as it was
