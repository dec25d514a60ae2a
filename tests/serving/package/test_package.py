"""The package contract (``serving.package``): the typed manifest, and tampered packages refused everywhere.

A package may only name files inside its directory (no ``..``, no absolute path, no symlink out of it), every file
the loader opens must be in the checksum list, the special ids must fit the vocabularies, and a graph the runtime
cannot load is one line naming the file. Each tampered package is a copy of the session-wide tiny package
(``tests/conftest.py``) and is refused by ``mtgate verify``, ``mtgate translate`` and ``batch-score`` (exit 2, one
line on stderr, no traceback) and by ``mtgate serve`` (exit 2 at start).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from serving.commands.main import main
from serving.package import (
    Manifest,
    PackageError,
    open_package,
    parse_manifest,
    read_manifest,
    sha256_of,
    write_manifest,
)

ROOT = Path(__file__).resolve().parents[3]


def _edit(package: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change manifest.json in place (checksums not refreshed)."""
    path = package / "manifest.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    change(manifest)
    path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def _outside_copy(package: Path, rel: str, *, flip: bool) -> Path:
    """A copy of the package's ``rel`` outside the package (one byte flipped when ``flip``)."""
    outside = package.parent / "outside"
    outside.mkdir(exist_ok=True)
    target = outside / Path(rel).name
    data = bytearray((package / rel).read_bytes())
    if flip:
        data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return target


def _artifact(manifest: dict[str, Any], runtime: str = "onnxruntime") -> dict[str, Any]:
    return next(a for a in manifest["artifacts"] if a["runtime"] == runtime and a["precision"] == "fp32")


def _dotdot(package: Path) -> str:
    _outside_copy(package, "onnx/encoder.onnx", flip=True)
    _edit(package, lambda m: _artifact(m)["files"].update(encoder="../outside/encoder.onnx"))
    return "'../outside/encoder.onnx': points outside the package"


def _absolute(package: Path) -> str:
    target = _outside_copy(package, "onnx/decoder.onnx", flip=True)
    _edit(package, lambda m: _artifact(m)["files"].update(decoder=str(target)))
    return f"'{target}': an absolute path"


def _tokenizer_outside(package: Path) -> str:
    _outside_copy(package, "tokenizer/source.spm", flip=False)
    _edit(package, lambda m: m["tokenizer"]["files"].update(source_spm="../outside/source.spm"))
    return "tokenizer.files.source_spm '../outside/source.spm': points outside the package"


def _symlink_out(package: Path) -> str:
    target = _outside_copy(package, "onnx/encoder.onnx", flip=False)  # same bytes: the checksum alone would pass
    (package / "onnx" / "encoder.onnx").unlink()
    (package / "onnx" / "encoder.onnx").symlink_to(target)
    return "onnx/encoder.onnx: resolves outside the package"


def _unlisted(package: Path) -> str:
    _edit(package, lambda m: m["files"].pop("onnx/decoder.onnx"))
    return "onnx/decoder.onnx: not in the checksum list"


def _unlisted_companion(package: Path) -> str:
    _edit(package, lambda m: m["files"].pop("openvino/decoder.bin"))
    return "openvino/decoder.bin: not in the checksum list"


def _emptied(package: Path) -> str:
    _edit(package, lambda m: m.update(files={}))
    return "the checksum list ('files') is empty"


def _eos_out_of_range(package: Path) -> str:
    _edit(package, lambda m: m["special_ids"].update(eos=m["architecture"]["target_vocab_size"]))
    return "special_ids.eos="


def _bad_word_out_of_range(package: Path) -> str:
    _edit(package, lambda m: m["decoding"].update(bad_word_ids=[10**6]))
    return "decoding.bad_word_ids[0]=1000000 is outside the target vocabulary"


def _truncated_onnx(package: Path) -> str:
    path = package / "onnx" / "decoder.onnx"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    _edit(package, lambda m: m["files"].update({"onnx/decoder.onnx": sha256_of(path)}))  # the checksum "fixed"
    return "onnx/decoder.onnx: onnxruntime cannot load this graph"


TAMPERINGS: dict[str, Callable[[Path], str]] = {
    "dotdot": _dotdot,
    "absolute": _absolute,
    "tokenizer-outside": _tokenizer_outside,
    "symlink-out": _symlink_out,
    "unlisted": _unlisted,
    "unlisted-companion": _unlisted_companion,
    "emptied-list": _emptied,
    "eos-out-of-range": _eos_out_of_range,
    "bad-word-out-of-range": _bad_word_out_of_range,
    "truncated-onnx": _truncated_onnx,
}


@pytest.fixture(params=list(TAMPERINGS))
def tampered(request: pytest.FixtureRequest, tiny_package: Path, tmp_path: Path) -> tuple[Path, str]:
    """(a tampered copy of the tiny package, what the refusal must say)."""
    package = shutil.copytree(tiny_package, tmp_path / "pkg")
    return package, TAMPERINGS[request.param](package)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], expected: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert expected in err


def test_verify_refuses(tampered: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    package, expected = tampered
    _refused(["verify", str(package)], capsys, expected)


def test_translate_refuses(tampered: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    package, expected = tampered
    _refused(["translate", "-m", str(package), "--threads", "1", "A dog runs."], capsys, expected)
    assert capsys.readouterr().out == ""


def test_batch_score_refuses(tampered: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    package, expected = tampered
    source = tmp_path / "in.txt"
    source.write_text("A dog runs.\nTwo men talk.\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    _refused(["batch-score", str(source), "-m", str(package), "-o", str(out), "--workers", "1", "--no-progress"],
             capsys, expected)
    assert not out.exists()
    if "cannot load this graph" not in expected:  # refused before any work: nothing written at all
        assert not list(tmp_path.glob("out.txt*")) and not list(tmp_path.glob(".out.txt*"))


@pytest.mark.parametrize("tampering", ["dotdot", "emptied-list", "truncated-onnx"])
def test_serve_refuses_at_start(tampering: str, tiny_package: Path, tmp_path: Path) -> None:
    package = shutil.copytree(tiny_package, tmp_path / "pkg")
    expected = TAMPERINGS[tampering](package)
    result = subprocess.run(
        [sys.executable, "-m", "serving.commands.main", "serve", "-m", str(package), "--port", "0", "--threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("mtgate serve: error:") and expected in lines[-1]
    if tampering != "truncated-onnx":  # refused from the manifest, before the server binds or loads anything
        assert len(lines) == 1, result.stderr


def test_openvino_graph_it_cannot_load(tiny_package: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("openvino")
    package = shutil.copytree(tiny_package, tmp_path / "pkg")
    weights = package / "openvino" / "decoder.bin"
    weights.write_bytes(weights.read_bytes()[:100])
    _edit(package, lambda m: m["files"].update({"openvino/decoder.bin": sha256_of(weights)}))
    _refused(["translate", "-m", str(package), "--runtime", "openvino", "--threads", "1", "A dog runs."], capsys,
             "openvino/decoder.xml: openvino cannot load this graph")


# --- the typed manifest -----------------------------------------------------------------------------------------


def test_the_typed_manifest_writes_back_what_is_on_disk(tiny_package: Path) -> None:
    on_disk = json.loads((tiny_package / "manifest.json").read_text(encoding="utf-8"))
    manifest = open_package(tiny_package).manifest
    assert manifest.to_dict() == on_disk
    assert list(manifest.to_dict()) == list(on_disk)  # same key order: the files on disk do not change
    assert manifest.special_ids.eos == on_disk["special_ids"]["eos"]
    assert manifest.architecture.max_positions == on_disk["architecture"]["max_positions"]
    assert manifest.decoding.bad_word_ids == tuple(on_disk["decoding"]["bad_word_ids"])
    assert {a.key for a in manifest.artifacts} == {"onnxruntime/fp32", "openvino/fp32"}
    assert read_manifest(tiny_package) == on_disk  # the dict view, for callers not yet on Manifest


def test_one_error_lists_every_problem(tiny_package: Path) -> None:
    data = json.loads((tiny_package / "manifest.json").read_text(encoding="utf-8"))
    del data["architecture"]["d_model"]
    data["architecture"]["pre_norm"] = "no"
    data["decoding"]["length_penalty_kind"] = "fancy"
    data["special_ids"]["pad"] = -1
    with pytest.raises(PackageError) as raised:
        parse_manifest(data, "pkg/manifest.json")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("pkg/manifest.json: ")
    for problem in ("architecture.d_model: missing", "architecture.pre_norm: expected true or false",
                    "decoding.length_penalty_kind: 'fancy'"):
        assert problem in message
    data = json.loads((tiny_package / "manifest.json").read_text(encoding="utf-8"))
    data["special_ids"]["pad"] = -1
    data["tokenizer"]["files"]["vocab"] = "/etc/passwd"
    with pytest.raises(PackageError, match=r"special_ids.pad=-1 .*; tokenizer.files.vocab '/etc/passwd'"):
        parse_manifest(data)



def test_types_are_strict_and_each_problem_names_its_field_path(tiny_package: Path) -> None:
    """JSON types as they are (a bool, a string or a float is no integer), a key the reader does not know is ignored,
    and each problem of every section is listed at once under its path (list items by index)."""
    data = json.loads((tiny_package / "manifest.json").read_text(encoding="utf-8"))
    data["architecture"]["some_later_field"] = 1  # a newer writer's key: ignored
    data["decoding"]["note"] = "x"
    assert parse_manifest(data).architecture == parse_manifest(json.loads(
        (tiny_package / "manifest.json").read_text(encoding="utf-8"))).architecture
    data["special_ids"]["eos"] = True
    data["architecture"]["d_model"] = "16"
    data["architecture"]["norm_epsilon"] = None
    data["decoding"]["bad_word_ids"] = [1, 2.0]
    data["artifacts"][0]["files"].pop("decoder")
    data["tokenizer"]["unk_id"] = "0"
    data["files"]["onnx/encoder.onnx"] = 7
    data["name"] = 3
    with pytest.raises(PackageError) as raised:
        parse_manifest(data, "pkg/manifest.json")
    message = str(raised.value)
    assert "\n" not in message and message.startswith("pkg/manifest.json: ")
    for problem in ("architecture.d_model: expected an integer, got '16'",
                    "architecture.norm_epsilon: expected a number, got None",
                    "special_ids.eos: expected an integer, got True",
                    "decoding.bad_word_ids[1]: expected an integer, got 2.0", "artifacts[0].files.decoder: missing",
                    "tokenizer.unk_id: expected an integer, got '0'",
                    "files.onnx/encoder.onnx: expected a string, got 7", "name: expected a string, got 3"):
        assert problem in message, problem
    assert message.count("; ") == 7

def test_written_manifests_are_validated(tiny_package: Path, tmp_path: Path) -> None:
    package = shutil.copytree(tiny_package, tmp_path / "pkg")
    before = (package / "manifest.json").read_bytes()
    manifest = read_manifest(package)
    manifest["special_ids"]["decoder_start"] = 10**6
    with pytest.raises(PackageError, match="special_ids.decoder_start"):
        write_manifest(package, manifest)
    assert (package / "manifest.json").read_bytes() == before
    assert not [p for p in package.iterdir() if p.name.startswith(".")]
    written = write_manifest(package, open_package(package).manifest)
    assert isinstance(written, Manifest) and (package / "manifest.json").read_bytes() == before


def test_one_version_source(tiny_package: Path) -> None:
    import importlib.metadata
    import tomllib

    import serving

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert serving.__version__ == importlib.metadata.version("mtgate") == declared
    assert open_package(tiny_package).manifest.mtgate_version == serving.__version__  # what convert records


def test_a_file_changed_after_it_was_verified_is_verified_again(tiny_package: Path, tmp_path: Path) -> None:
    """A process hashes each file once (serve opens a package before binding its port and again at load); a write
    after that, even of the same size, is noticed on the next open."""
    package = tmp_path / "pkg"
    shutil.copytree(tiny_package, package)
    open_package(package)
    rel = next(r for r in read_manifest(package)["files"] if r.endswith(".onnx"))
    data = bytearray((package / rel).read_bytes())
    data[-1] ^= 0xFF
    (package / rel).write_bytes(bytes(data))
    with pytest.raises(PackageError, match="sha256 mismatch"):
        open_package(package)
