"""`hexiseq info`: human output, JSON, and clear errors (no tracebacks)."""

import json

from hexiseq.cli import main


def test_info_testbed(capsys):
    assert main(["info", "testbed-8", "--model", "llama2-7b"]) == 0
    out = capsys.readouterr().out
    assert "H100-SXM" in out and "A100-80GB" in out and "5.20 PFLOP/s" in out
    assert "between nodes 25 GB/s" in out and "ZeRO-3 over 8 GPUs" in out


def test_info_json(capsys):
    assert main(["info", "sim-64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["devices"] == 64 and set(d["types"]) == {"H100-SXM", "A100-80GB", "A800", "L40S"}


def test_info_errors_are_one_line(capsys):
    assert main(["info", "testbed-8", "--model", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'nope'" in err and "Traceback" not in err


def test_info_model_states_json(capsys):
    """16 bytes of training state per parameter; 7B replicated exceeds an 80 GiB A100, ZeRO-3 over 8 fits."""
    from hexiseq.specs import GIB, get_model

    assert main(["info", "testbed-8", "--model", "llama2-7b", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["model_states"]
    params = get_model("llama2-7b").param_count
    assert fit["state_gib"] == round(16 * params / GIB, 1)
    assert fit["zero3_per_device_gib"] == round(16 * params / 8 / GIB, 2)
    assert fit["replicated_fits"] is False and fit["zero3_fits"] is True
