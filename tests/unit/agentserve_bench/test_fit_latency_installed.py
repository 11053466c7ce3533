"""`agentserve bench fit-latency` needs no checkout: it parses and reads no repo paths."""

from __future__ import annotations

import argparse
import inspect

from agentserve_bench import fit_latency


def test_fit_latency_parses_without_a_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no docs/ here
    parser = argparse.ArgumentParser()
    fit_latency.add_parser(parser.add_subparsers(dest="kind"))
    args = parser.parse_args(["fit-latency", "--url", "http://h:8000", "--model", "m"])
    assert (args.url, args.model, args.out) == ("http://h:8000", "m", None)
    source = inspect.getsource(fit_latency)
    assert "__file__" not in source and "default_docs" not in source
