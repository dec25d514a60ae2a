"""``mtgate convert`` / ``mtgate verify`` end to end through the CLI: exit codes, messages, nothing half-written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from serving.commands.main import main
from serving.package import PackageError, load_manifest
from tests.utils.marian_factory import make_marian_dir

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_marian_dir(tmp_path_factory.mktemp("cli") / "src", seed=11)


@pytest.fixture(scope="module")
def package(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cli-pkg") / "pkg"
    assert main(["convert", str(source), "-o", str(out), "--runtimes", "onnxruntime,openvino", "--precisions", "fp32",
                 "--name", "tiny-cli", "--version", "7"]) == 0
    return out


def _bad(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Run a command expected to fail with exit 2; return its stderr lines."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()


def test_convert_writes_a_verified_package(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = load_manifest(package)
    assert (manifest["name"], manifest["version"]) == ("tiny-cli", "7")
    assert manifest["parity"]["onnxruntime/fp32"]["passed"] and manifest["parity"]["openvino/fp32"]["passed"]
    assert set(manifest["conversion"]["seconds"]) >= {"load", "onnx", "openvino", "parity"}
    assert not [p for p in package.parent.iterdir() if p.name.startswith(".")]  # no staging leftovers


def test_verify_passes_on_a_fresh_package(package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(package)]) == 0
    out = capsys.readouterr().out
    assert "checksums: OK" in out and "openvino/fp32" in out and out.rstrip().splitlines()[-1].startswith("PASS")
    assert main(["verify", "-m", str(package)]) == 0  # -m PKG, as every other command takes a package
    by_m = capsys.readouterr().out
    assert by_m.splitlines()[0] == out.splitlines()[0] and by_m.rstrip().splitlines()[-1].startswith("PASS")
    assert "two packages" in _bad(["verify", str(package), "-m", str(package.parent)], capsys)[-1]


def test_verify_against_the_source(package: Path, source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(package), "--checkpoint", str(source), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"]
    by_key = {(r["artifact"], r["reference"]): r for r in report["parity"]}
    assert by_key[("onnx fp32 graphs", "source")]["log_probs_max_abs"] < 1e-4
    assert by_key[("openvino/fp32", "source")]["log_probs_max_abs"] < 1e-4


def test_tampered_artifact_fails_verify_and_load(package: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    tampered = shutil.copytree(package, tmp_path / "pkg")
    with (tampered / "openvino" / "decoder.bin").open("r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02\x03")
    assert main(["verify", str(tampered)]) == 1
    err = capsys.readouterr().err
    assert "openvino/decoder.bin" in err and "sha256 mismatch" in err
    with pytest.raises(PackageError, match="openvino/decoder.bin"):
        load_manifest(tampered)


def test_verify_reports_files_outside_the_checksum_list(package: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    copy = shutil.copytree(package, tmp_path / "pkg")
    (copy / "tokenizer").mkdir(exist_ok=True)
    (copy / "tokenizer" / "notes.txt").write_text("added after conversion")
    assert main(["verify", str(copy)]) == 0  # a warning: nothing opens it, nothing checks it
    captured = capsys.readouterr()
    assert "mtgate verify: WARN tokenizer/notes.txt: not in the checksum list" in captured.err
    assert "checksums: OK (" in captured.out and "1 unlisted file(s), not verified: tokenizer/notes.txt" in captured.out
    secret = tmp_path / "secret.txt"  # as /etc/passwd would be
    secret.write_text("root:x:0:0")
    (copy / "tokenizer" / "extra.txt").symlink_to(secret)
    assert main(["verify", str(copy), "--json"]) == 1  # a failed check: export-triton refuses such a package
    captured = capsys.readouterr()
    assert f"mtgate verify: FAIL tokenizer/extra.txt -> {secret}: a symlink out of the package" in captured.err
    report = json.loads(captured.out)
    assert not report["passed"] and not report["checksums"]["passed"]
    assert report["checksums"]["unlisted"] == ["tokenizer/notes.txt"]
    assert report["checksums"]["links_out_of_package"] == {"tokenizer/extra.txt": str(secret)}
    assert all(row["passed"] for row in report["parity"])  # parity was still checked


def test_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    out = tmp_path / "out"
    lines = _bad(["convert", str(tmp_path), "-o", str(out)], capsys)
    assert len(lines) == 1 and "not a recognized checkpoint" in lines[0] and lines[0].startswith("mtgate convert:")
    assert not out.exists()
    lines = _bad(["convert", str(tmp_path / "missing"), "-o", str(out)], capsys)
    assert len(lines) == 1 and "no such directory" in lines[0]


def test_missing_vocab(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = shutil.copytree(source, tmp_path / "src")
    (broken / "vocab.json").unlink()
    out = tmp_path / "out"
    lines = _bad(["convert", str(broken), "-o", str(out)], capsys)
    assert len(lines) == 2 and "missing vocab/tokenizer file(s): vocab.json" in lines[1]
    assert not out.exists()


def test_unsupported_options_all_listed(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = shutil.copytree(source, tmp_path / "src")
    config = json.loads((broken / "config.json").read_text())
    config |= {"normalize_before": True, "add_final_layer_norm": True, "activation_function": "tanh",
               "static_position_embeddings": False}
    (broken / "config.json").write_text(json.dumps(config))
    out = tmp_path / "out"
    lines = _bad(["convert", str(broken), "-o", str(out)], capsys)
    assert "cannot convert this Marian checkpoint" in lines[0]
    reasons = "\n".join(lines[1:])
    for option in ("normalize_before", "add_final_layer_norm", "activation_function 'tanh'",
                   "static_position_embeddings"):
        assert option in reasons
    assert len(lines) == 5
    assert not out.exists()


def test_wrong_weight_shape(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors.numpy import load_file, save_file

    broken = shutil.copytree(source, tmp_path / "src")
    tensors = load_file(broken / "model.safetensors")
    tensors["model.encoder.layers.0.self_attn.k_proj.weight"] = np.zeros((32, 31), dtype=np.float32)
    save_file(tensors, broken / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    lines = _bad(["convert", str(broken), "-o", str(out)], capsys)
    assert lines[0].startswith("mtgate convert: error:") and "invalid model" in lines[0]
    assert lines[1:] == ["  weight encoder.layers.0.self_attn.k.weight has shape [31, 32], expected [32, 32]"]
    assert not out.exists()


def test_failed_conversion_keeps_the_previous_package(package: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    existing = shutil.copytree(package, tmp_path / "pkg")
    before = (existing / "manifest.json").read_bytes()
    _bad(["convert", str(tmp_path / "nothing"), "-o", str(existing)], capsys)
    assert (existing / "manifest.json").read_bytes() == before


def test_an_existing_output_is_replaced_only_with_overwrite(package: Path, source: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    existing = shutil.copytree(package, tmp_path / "pkg")
    before = (existing / "manifest.json").read_bytes()
    argv = ["convert", str(source), "-o", str(existing), "--runtimes", "onnxruntime", "--precisions", "fp32",
            "--no-verify", "--name", "replaced"]
    lines = _bad(argv, capsys)
    assert len(lines) == 1 and "already exists" in lines[0] and "--overwrite" in lines[0]
    assert (existing / "manifest.json").read_bytes() == before
    assert main([*argv, "--overwrite"]) == 0
    manifest = load_manifest(existing)
    assert manifest["name"] == "replaced" and [a["runtime"] for a in manifest["artifacts"]] == ["onnxruntime"]
    assert not (existing / "openvino").exists()  # the old package is gone as a whole, not merged into
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]  # no staging or old-package leftovers


def test_a_failed_overwrite_keeps_the_previous_package(package: Path, source: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    existing = shutil.copytree(package, tmp_path / "pkg")
    before = (existing / "manifest.json").read_bytes()
    broken = shutil.copytree(source, tmp_path / "src")
    (broken / "vocab.json").unlink()
    _bad(["convert", str(broken), "-o", str(existing), "--overwrite"], capsys)
    assert (existing / "manifest.json").read_bytes() == before
    assert load_manifest(existing)["name"] == "tiny-cli"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pkg", "src"]


def test_bad_runtime_and_t2t_option_for_marian(source: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    lines = _bad(["convert", str(source), "-o", str(out), "--runtimes", "tensorrt"], capsys)
    assert len(lines) == 1 and "supported runtimes: onnxruntime, openvino" in lines[0]
    lines = _bad(["convert", str(source), "-o", str(out), "--hparams-set", "transformer_base"], capsys)
    assert "option 'hparams_set' does not apply to Marian checkpoints" in "\n".join(lines)
    assert not out.exists()


def test_verify_rejects_a_non_package(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _bad(["verify", str(tmp_path)], capsys)
    assert len(lines) == 1 and "not an mtgate model package" in lines[0]
