"""`mtgate export-triton`: the repository layout, config.pbtxt as Triton's ModelConfig, and model.py driven like Triton.

config.pbtxt is parsed with the ModelConfig protobuf that tritonclient ships (tritonclient.grpc.model_config_pb2,
generated from Triton's model_config.proto). model.py runs in a subprocess (as in Triton's stub process) against a
stand-in of triton_python_backend_utils (tests/deploy/triton_stub), and must answer exactly what the engine answers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from serving.commands.export_triton import PACKAGE_DIR
from serving.commands.main import main
from serving.engine.translator import DecodeOptions, Translator
from serving.package import choose_precision, read_manifest
from serving.server.oip import INPUT_NAME, OUTPUT_DATATYPES

DRIVER = Path(__file__).resolve().parent / "triton_driver.py"
SENTENCES = ["A man is walking down the street.", "Two dogs play in the snow.", "Hello!"]
# v2 datatype (what mtgate's /v2 model metadata reports) -> Triton config data type
_CONFIG_TYPES = {"BYTES": model_config_pb2.TYPE_STRING, "INT32": model_config_pb2.TYPE_INT32,
                 "FP32": model_config_pb2.TYPE_FP32}


@pytest.fixture(scope="module")
def exported(model_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton-repo")
    code = main(["export-triton", str(model_package), "-o", str(repo), "--model-name", "translator", "--threads", "1",
                 "--max-batch-size", "16", "--max-queue-delay-us", "2000", "--max-queue-size", "64",
                 "--precision", "fp32"])  # what Translator.load loads by default, which the tests compare with
    assert code == 0
    return repo / "translator"


def parse_config(model_dir: Path) -> Any:
    return text_format.Parse((model_dir / "config.pbtxt").read_text(encoding="utf-8"), model_config_pb2.ModelConfig())


def test_repository_layout(exported: Path, model_package: Path) -> None:
    assert sorted(p.name for p in exported.iterdir()) == ["1", "config.pbtxt"]
    version = exported / "1"
    assert {p.name for p in version.iterdir()} == {"model.py", "package", "mtgate", "requirements.txt"}
    assert (version / "package" / "manifest.json").read_bytes() == (model_package / "manifest.json").read_bytes()
    assert (version / "mtgate" / "serving" / "engine" / "translator.py").is_file()
    assert [p.name for p in (version / "mtgate").iterdir()] == ["serving"]  # the engine needs nothing else
    assert not list((version / "mtgate").rglob("__pycache__"))
    requirements = (version / "requirements.txt").read_text(encoding="utf-8")
    assert "numpy==" in requirements and "onnxruntime==" in requirements
    assert "torch" not in requirements and "transformers" not in requirements
    compile((version / "model.py").read_text(encoding="utf-8"), "model.py", "exec")


def test_config_is_a_triton_model_config_matching_the_v2_route(exported: Path) -> None:
    config = parse_config(exported)
    assert config.name == exported.name  # Triton requires the directory name
    assert config.backend == "python"
    assert config.max_batch_size == 16
    assert config.HasField("dynamic_batching")
    assert config.dynamic_batching.max_queue_delay_microseconds == 2000
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 64
    [inp] = config.input
    assert (inp.name, inp.data_type, list(inp.dims)) == (INPUT_NAME, model_config_pb2.TYPE_STRING, [1])
    # the same outputs, in the same order and types, as `mtgate serve` reports on /v2/models/{name}
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        (name, _CONFIG_TYPES[datatype], [1]) for name, datatype in OUTPUT_DATATYPES.items()
    ]
    [group] = config.instance_group
    assert (group.count, group.kind) == (1, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    params = {key: value.string_value for key, value in config.parameters.items()}
    assert params == {"runtime": "onnxruntime", "precision": "fp32", "threads": "1", "package": "package"}


def test_default_config_parses_and_unbounded_queue_has_no_policy(model_package: Path, tmp_path: Path) -> None:
    assert main(["export-triton", str(model_package), "-o", str(tmp_path)]) == 0
    [model_dir] = tmp_path.iterdir()
    config = parse_config(model_dir)
    assert config.name == model_dir.name == json.loads((model_package / "manifest.json").read_text())["name"]
    assert config.max_batch_size == 32 and config.dynamic_batching.max_queue_delay_microseconds == 0
    assert not config.dynamic_batching.HasField("default_queue_policy")
    assert config.parameters["threads"].string_value == ""
    # --precision auto (the default) writes the precision it chose: what the model will load
    chosen = choose_precision(read_manifest(model_package), "onnxruntime").precision
    assert config.parameters["precision"].string_value == chosen


def drive(model_dir: Path, executions: list[list[dict[str, Any]]]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(model_dir), "1"], input=json.dumps(executions), capture_output=True,
        text=True, timeout=120, cwd=model_dir.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_model_py_translates_like_the_engine(exported: Path, model_package: Path) -> None:
    executions = [[  # one dynamic batch of four requests: two shapes, two decoding options, two bad requests
        {"texts": [[SENTENCES[0]], [SENTENCES[1]]], "parameters": {"max_length": 12}},
        {"texts": [[SENTENCES[2]]], "parameters": {"max_length": 12}},
        {"texts": None},
        {"texts": [[SENTENCES[0]]], "parameters": {"beam_size": 0}},
        {"texts": [[SENTENCES[1]]], "parameters": {"max_length": 5, "beam_size": 1}},
    ]]
    answer = drive(exported, executions)
    # model.py imports the engine bundled in the version directory, not the test's
    assert Path(answer["serving_file"]).resolve().is_relative_to(exported.resolve())
    assert answer["mtgate_packages"] == ["serving"]  # serving alone: no converters, batch or loadtest
    [results] = answer["results"]

    translator = Translator.load(model_package, threads=1)
    expected_12 = translator.translate(SENTENCES, DecodeOptions(max_length=12))
    expected_5 = translator.translate([SENTENCES[1]], DecodeOptions(max_length=5, beam_size=1))

    def check(result: dict[str, Any], expected: list[Any]) -> None:
        outputs = result["outputs"]
        shape = [len(expected), 1]
        assert {n: (o["dtype"], o["shape"]) for n, o in outputs.items()} == {
            "OUTPUT_TEXT": ("object", shape), "INPUT_TOKENS": ("int32", shape), "OUTPUT_TOKENS": ("int32", shape),
            "SCORE": ("float32", shape),
        }
        assert outputs["OUTPUT_TEXT"]["data"] == [[t.text] for t in expected]
        assert outputs["INPUT_TOKENS"]["data"] == [[t.input_tokens] for t in expected]
        assert outputs["OUTPUT_TOKENS"]["data"] == [[t.output_tokens] for t in expected]
        assert [s for [s] in outputs["SCORE"]["data"]] == pytest.approx([t.score for t in expected], abs=1e-5)

    check(results[0], expected_12[:2])
    check(results[1], expected_12[2:])
    assert results[2] == {"error": f"missing input {INPUT_NAME!r}"}
    assert results[3] == {"error": "parameter 'beam_size' must be a positive integer, got 0"}
    check(results[4], expected_5)
    assert all(t.text for t in expected_12)


def test_a_too_long_request_fails_alone(exported: Path, model_package: Path) -> None:
    limit = Translator.load(model_package, threads=1).info.max_input_tokens
    too_long = " ".join(["walking"] * (limit + 5))
    [results] = drive(exported, [[
        {"texts": [[SENTENCES[2]]], "parameters": {"max_length": 4}},
        {"texts": [[SENTENCES[1]], [too_long]], "parameters": {"max_length": 4}},
        {"texts": [[SENTENCES[0]]], "parameters": {"max_length": 4}},
    ]])["results"]
    assert "outputs" in results[0] and "outputs" in results[2]
    assert results[1]["error"].startswith("text 1 has ")
    assert results[1]["error"].endswith(f"the model accepts at most {limit}")


def test_export_replaces_a_model_and_keeps_the_others(model_package: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-model"
    other.mkdir()
    (other / "config.pbtxt").write_text('name: "other-model"\n')
    for threads in ("1", "2"):  # the second replaces the first (--overwrite: refused without it)
        assert main(["export-triton", str(model_package), "-o", str(tmp_path), "--model-name", "m",
                     "--threads", threads, *(["--overwrite"] if threads == "2" else [])]) == 0
    assert parse_config(tmp_path / "m").parameters["threads"].string_value == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "other-model"]  # no staging leftovers


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-name", "bad/name"], "is not usable as a Triton model directory"),
        (["--max-batch-size", "0"], "--max-batch-size must be at least 1"),
        (["--precision", "int8"], "no onnxruntime/int8 artifact"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    model_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    artifacts = json.loads((model_package / "manifest.json").read_text(encoding="utf-8"))["artifacts"]
    if "int8" in args and any(a["runtime"] == "onnxruntime" and a["precision"] == "int8" for a in artifacts):
        pytest.skip("this package has an onnxruntime/int8 artifact")
    assert main(["export-triton", str(model_package), "-o", str(tmp_path / "repo"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_not_a_package_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export-triton", str(tmp_path / "nope"), "-o", str(tmp_path / "repo")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtgate export-triton: error: ") and err.count("\n") == 1


def test_options_use_the_one_vocabulary(model_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # -m PKG as in every other command, --runtime (the old --backend accepted, hidden from --help)
    assert main(["export-triton", "-m", str(model_package), "-o", str(tmp_path), "--model-name", "a",
                 "--runtime", "onnxruntime"]) == 0
    assert main(["export-triton", str(model_package), "-o", str(tmp_path), "--model-name", "b",
                 "--backend", "onnxruntime"]) == 0
    for name in ("a", "b"):
        assert parse_config(tmp_path / name).parameters["runtime"].string_value == "onnxruntime"
    capsys.readouterr()
    assert main(["export-triton", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "--runtime" in help_text and "-m PKG" in help_text and "--backend" not in help_text


@pytest.mark.parametrize(
    ("args", "message"),
    [([], "which package?"), (["PKG", "-m", "other"], "two packages")],
)
def test_one_package_is_given(model_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                              args: list[str], message: str) -> None:
    argv = [str(model_package) if a == "PKG" else a for a in args]
    assert main(["export-triton", *argv, "-o", str(tmp_path / "repo")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("mtgate export-triton: error: ")
    assert not (tmp_path / "repo").exists()


def test_only_listed_files_are_exported(model_package: Path, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    package = tmp_path / "package"
    shutil.copytree(model_package, package)
    (package / "tokenizer").mkdir(exist_ok=True)
    (package / "tokenizer" / "notes.txt").write_text("added after conversion, not in the checksum list")
    assert main(["export-triton", str(package), "-o", str(tmp_path / "repo"), "--model-name", "m"]) == 0
    exported = tmp_path / "repo" / "m" / "1" / PACKAGE_DIR
    listed = set(json.loads((package / "manifest.json").read_text(encoding="utf-8"))["files"])
    assert {p.relative_to(exported).as_posix() for p in exported.rglob("*") if p.is_file()} == {"manifest.json",
                                                                                                *listed}
    assert "left out 1 file(s) not in the checksum list: tokenizer/notes.txt" in caplog.text


def test_a_symlink_out_of_the_package_is_refused(model_package: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    package = tmp_path / "package"
    shutil.copytree(model_package, package)
    (package / "tokenizer").mkdir(exist_ok=True)
    secret = tmp_path / "secret.txt"  # as /etc/passwd would be
    secret.write_text("root:x:0:0")
    (package / "tokenizer" / "extra.txt").symlink_to(secret)  # not listed: the export used to copy its target
    assert main(["export-triton", str(package), "-o", str(tmp_path / "repo2"), "--model-name", "m"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("mtgate export-triton: error: "), err
    assert f"tokenizer/extra.txt is a symlink to {secret}, outside the package" in err, err
    assert not (tmp_path / "repo2").exists()
