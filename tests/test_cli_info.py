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
