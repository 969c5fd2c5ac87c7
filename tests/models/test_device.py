"""Devices and dtypes: ``auto`` resolution, clear errors for missing devices, and the step loop
keeping its tensors on the model's device (exercised on the CPU by passing it explicitly; the
CUDA tests run where a GPU is present)."""

import pytest
import torch

import cdsl_struct as cs
from cdsl_struct.constraints.mask import allocate_bitmask, apply_bitmask, set_bit
from cdsl_struct.decoding import SamplingParams, build_proposers, decode
from cdsl_struct.errors import CdslError
from cdsl_struct.models.device import DeviceUnavailable, cpu_has_native_bf16, resolve_device, resolve_dtype
from cdsl_struct.models.runner import ModelRunner, self_draft
from cdsl_struct.prompts import prompt_ids

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_auto_picks_the_best_present_device():
    expected = "cuda" if torch.cuda.is_available() else (
        "mps" if torch.backends.mps.is_available() else "cpu")
    assert resolve_device("auto").type == expected
    assert resolve_device("cpu") == torch.device("cpu")


def test_auto_dtype_on_cpu_follows_native_bf16_and_names_parse(monkeypatch, tmp_path):
    monkeypatch.setenv("CDSL_CPU_BF16", "0")
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    monkeypatch.setenv("CDSL_CPU_BF16", "1")
    assert resolve_dtype("auto", torch.device("cpu")) is torch.bfloat16
    monkeypatch.delenv("CDSL_CPU_BF16")
    zen4, old = tmp_path / "zen4", tmp_path / "old"
    zen4.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    old.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert cpu_has_native_bf16(str(zen4)) and not cpu_has_native_bf16(str(old))
    assert not cpu_has_native_bf16(str(tmp_path / "missing"))
    assert resolve_dtype("auto", torch.device("cpu")) is (torch.bfloat16 if cpu_has_native_bf16() else torch.float32)
    assert resolve_dtype("float32", torch.device("cpu")) is torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("float8", torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU is present")
def test_missing_device_is_a_clear_error():
    with pytest.raises(DeviceUnavailable, match="no CUDA GPU"):
        resolve_device("cuda:0")
    with pytest.raises(DeviceUnavailable, match="unknown device"):
        resolve_device("tpu")


def test_bitmask_is_applied_on_the_logits_device_in_bulk():
    rows = allocate_bitmask(100, batch=3)
    for row, token in zip(rows, (1, 64, 99), strict=True):
        set_bit(row, token)
    logits = torch.zeros(3, 100)
    masked = apply_bitmask(logits, rows)
    assert [int(t) for t in torch.isfinite(masked).nonzero()[:, 1]] == [1, 64, 99]


def test_step_loop_tensors_live_on_the_given_device(smollm2):
    loaded = smollm2
    device = loaded.device  # the fixture's: the CPU, or a GPU where one is present
    assert loaded.device == device
    runner = ModelRunner(loaded.model)
    ids = prompt_ids(loaded.tokenizer, "Say yes.")
    logits = runner.run(ids, keep=1)
    assert logits.device == device and runner.device == device
    assert SamplingParams(seed=1).generator(device).device == device


def test_int8_draft_builds_and_decodes_losslessly(smollm2, one_torch_thread):
    if smollm2.device.type != "cpu":  # the fixture is on the GPU where one is present; int8 is the CPU's
        from cdsl_struct.models.loading import load_model

        smollm2 = load_model("smollm2", device="cpu")
    compiled = cs.compile(cs.Choice(["yes", "no", "maybe"]), smollm2.tokenizer, eos_token_ids=smollm2.eos_token_ids)
    ids = prompt_ids(smollm2.tokenizer, "Is water wet? Answer yes, no or maybe.")
    target = ModelRunner(smollm2.model)
    plain = decode(target, compiled, ids, max_tokens=8)
    drafted = decode(target, compiled, ids, proposers=build_proposers("int8", smollm2.model), k=4, max_tokens=8)
    assert drafted.tokens == plain.tokens and drafted.stats.draft_passes > 0


def test_int8_draft_refuses_a_non_cpu_target():
    class OnMeta(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(2, 2, device="meta"))

    with pytest.raises(CdslError, match="CPU only"):
        self_draft(OnMeta(), "int8")


@cuda
def test_generate_on_cuda_keeps_the_step_loop_on_the_gpu():
    gen = cs.Generator("smollm2", device="cuda", draft="lookup")
    assert gen.device.type == "cuda" and gen.loaded.model.dtype in (torch.bfloat16, torch.float32)
    results = gen.generate_batch(["Ada Lovelace was 36. Extract the person.",
                                  "Alan Turing was 41. Extract the person."],
                                 schema={"type": "object", "properties": {"name": {"type": "string"},
                                                                          "age": {"type": "integer"}},
                                         "required": ["name", "age"]}, max_tokens=40)
    assert all(r.finish_reason != "stop" or isinstance(r.value, dict) for r in results)
    assert gen.engine.runner.device.type == "cuda"
    gen.close()


@cuda
def test_float32_cuda_batch_matches_the_cpu_single_row():
    cpu = cs.Generator("smollm2", device="cpu", dtype="float32", draft=None)
    gpu = cs.Generator("smollm2", device="cuda", dtype="float32", draft=None)
    prompts = ["Name a colour.", "Name a fruit.", "Name an animal.", "Name a city."]
    a = [cpu.generate(p, choices=["red", "apple", "cat", "Paris", "other"]).text for p in prompts]
    b = [r.text for r in gpu.generate_batch(prompts, choices=["red", "apple", "cat", "Paris", "other"])]
    assert sum(x == y for x, y in zip(a, b, strict=True)) >= 3
    cpu.close()
    gpu.close()


def test_load_model_takes_device_and_dtype():
    from cdsl_struct.models.loading import load_model

    loaded = load_model("smollm2", device="cpu", dtype="bfloat16")
    assert loaded.device == torch.device("cpu") and loaded.model.dtype is torch.bfloat16


def test_emulated_bf16_is_said_once_and_only_where_it_is_emulated(monkeypatch, caplog):
    from cdsl_struct.models import device

    monkeypatch.setattr(device, "_emulated_noted", [])
    cpu = torch.device("cpu")
    monkeypatch.setenv("CDSL_CPU_BF16", "1")  # a CPU with AVX-512 BF16 or AMX
    assert not device.note_emulated_bf16(torch.bfloat16, cpu)
    monkeypatch.setenv("CDSL_CPU_BF16", "0")  # an AVX2-only CPU
    with caplog.at_level("WARNING", logger=device.__name__):
        assert not device.note_emulated_bf16(torch.float32, cpu)
        assert device.note_emulated_bf16(torch.bfloat16, cpu, "model 'smollm2'")
        assert not device.note_emulated_bf16(torch.bfloat16, cpu, "the bf16 self-draft")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "model 'smollm2'" in messages[0] and "dtype='float32'" in messages[0]
    assert "by conversion" in messages[0]


@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_ragged_runner_passes_its_self_check_on_cuda(dtype):
    """The CUDA crash (a row's boolean mask with ``enable_gqa``) at its root: the real model on the
    GPU gets the ragged runner, not the padded fallback."""
    from cdsl_struct.models.loading import load_model
    from cdsl_struct.models.ragged import RaggedRunner
    from cdsl_struct.models.self_check import batch_runner, check_ragged

    loaded = load_model("smollm2", device="cuda", dtype=dtype)
    assert check_ragged(loaded.model) is None
    assert isinstance(batch_runner(loaded.model, pad_token_id=0), RaggedRunner)


@cuda
def test_float32_speculation_on_cuda_is_identical_to_target_only():
    """Lossless where verification is batch-invariant: float32 on the GPU."""
    from cdsl_struct.models.loading import load_model

    loaded = load_model("smollm2", device="cuda", dtype="float32")
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    compiled = cs.compile(cs.JsonSchema(schema), loaded.tokenizer, eos_token_ids=loaded.eos_token_ids)
    target = ModelRunner(loaded.model)
    lookup = build_proposers("lookup", loaded.model)
    for text in ("Ada Lovelace was 36. Extract the person as JSON.", "Alan Turing was 41. Extract the person."):
        ids = prompt_ids(loaded.tokenizer, text)
        plain = decode(target, compiled, ids, max_tokens=40)
        drafted = decode(target, compiled, ids, proposers=lookup, k=6, max_tokens=40)
        assert drafted.tokens == plain.tokens
