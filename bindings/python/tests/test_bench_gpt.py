"""bench/bench_gpt.py runs end to end on the CPU with its tiny --smoke config (no timing asserted):
every mode it can run here reports a finite median step time and losses, the modes it cannot run
(torchao without torchao or a GPU) say why, O2 and the peer carry a profiler top list, and the JSON
names the device, date and commit."""
import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "bench", "bench_gpt.py")


def test_bench_gpt_smoke(tmp_path):
    out = tmp_path / "gpt.json"
    r = subprocess.run([sys.executable, SCRIPT, "--smoke", "--out", str(out)], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["date"] and "commit" in res
    assert res["tokens_per_step"] == res["config"]["seq"] * res["config"]["batch"]
    modes = res["modes"]
    assert set(modes) == {"bf16", "torchao", "O1", "O2"}
    for m in ("bf16", "O1", "O2"):
        r_ = modes[m]
        assert math.isfinite(r_["step_ms_median"]) and r_["step_ms_median"] > 0, m
        assert math.isfinite(r_["loss_first"]) and math.isfinite(r_["loss_last"]), m
        assert len(r_["step_ms_all"]) == res["config"]["steps"]
        # the memory report's fields: counts always, bytes on CUDA only (None on the CPU)
        assert 0 < r_["linear_params"] <= r_["params_built"], m
        assert r_["rest_mem_MiB"] is None and r_["rest_bytes_per_linear_param"] is None, m
        assert r_["rest_bytes_per_linear_param_own"] is None and r_["rest_residual_MiB"] is None, m
        # held for the Linears' parameters, counted from the tensors, per Linear parameter: bf16 AMP
        # keeps F32 weights and AdamW's F32 m and v (12 B, 16 with a gradient); fp8amp O1 a BF16 weight,
        # an E4M3 gradient and F32 m, v (11 B); O2 m in E4M3 and v in F16 (6 B) -- plus block scales,
        # and the head (kept out of FP8 here, 12-16 B) pulls each up; issue 18's targets: O1 <= 13,
        # O2 <= 8
        assert modes[m]["held_linear_MiB"] > 0 and modes[m]["held_other_MiB"] > 0, m
    per = {m: modes[m]["held_linear_MiB"] * 2**20 / modes[m]["linear_params"] for m in ("bf16", "O1", "O2")}
    assert 12.0 <= per["bf16"] <= 16.0, per
    assert 11.0 <= per["O1"] <= 13.0 and 6.0 <= per["O2"] <= 8.0, per
    # the fp8amp Linears alone (no head), from their tensors: MS-AMP's layout, weights 11 B (O1: BF16
    # weight, E4M3 gradient, F32 m and v) and 6 B + block scales (8 B per 128) at O2, the biases
    # (one element in d = 64 per weight row here, at most 16 B each) on top
    fp8 = {m: modes[m]["held_bytes_per_fp8amp_linear_param"] for m in ("O1", "O2")}
    assert 11.0 <= fp8["O1"] <= 11.0 + 16 / 64 and 6.0 + 8 / 128 <= fp8["O2"] <= 6.0 + 8 / 128 + 16 / 64, fp8
    assert "held_bytes_per_fp8amp_linear_param" not in modes["bf16"]
    # the fp8amp modes count their Linears' graph replays per step (none on the CPU); bf16 has none
    for m in ("O1", "O2"):
        assert modes[m]["linear_calls_per_step"] > 0 and modes[m]["linear_graph_replays_per_step"] == 0, m
        # what fp8amp holds at rest: the Linears' tensors, and no scratch (given back at every step)
        assert modes[m]["fp8amp_rest_linear_MiB"] > 0 and modes[m]["fp8amp_rest_scratch_MiB"] == 0, m
    assert res["config"]["fp8amp_lean"] == 1

    assert "linear_graph_replays_per_step" not in modes["bf16"]
    # the same initial weights and batches: the first step's loss agrees (FP8 error only)
    assert abs(modes["O1"]["loss_first"] - modes["bf16"]["loss_first"]) < 0.05 * modes["bf16"]["loss_first"]
    assert "skipped" in modes["torchao"]  # no GPU here
    assert modes["O2"]["profile_top"] and res["profile_peer"] in modes
    assert modes[res["profile_peer"]]["profile_top"]
