"""`agentserve train-drafter` features -> train -> export on the real bundled target.

A handful of responses stand in for the data stage (which needs a vLLM engine and an hour):
the rest of the pipeline runs for real, and its output is a drafter that vLLM's format,
our loader and transformers' AutoModel all accept.
"""

from __future__ import annotations

import json

import pytest
from agentserve.cli import main
from agentserve.sources.models import BUNDLED_MODEL, resolve_model
from transformers import AutoTokenizer

from dflash.export import load_drafter

pytestmark = pytest.mark.slow

TEXTS = [
    ("Write a Python function that adds two numbers.", "def add(a, b):\n    return a + b\n"),
    ("What is 3 times 4?", "3 times 4 is 12. So the answer is 12."),
    ("Summarise: the build passed.", '{"summary": "the build passed", "status": "ok"}'),
    ("Name a colour.", "Blue is a colour. Blue, like the sky."),
]


def test_features_train_export_make_a_loadable_reduced_vocab_drafter(tmp_path, capsys):
    import torch
    from transformers import AutoModel

    model_dir = resolve_model(BUNDLED_MODEL, progress=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    work, out = tmp_path / "work", tmp_path / "drafter"
    work.mkdir()
    with (work / "responses.jsonl").open("w") as f:
        for i, (prompt, answer) in enumerate(TEXTS):
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_dict=False
            )
            record = {
                "id": f"t{i}",
                "source": "test",
                "mode": "greedy",
                "prompt_ids": list(ids),
                "response_ids": [*tokenizer.encode(answer), tokenizer.eos_token_id],
            }
            f.write(json.dumps(record) + "\n")
    common = ["train-drafter", "--work-dir", str(work), "--draft-vocab", "256"]
    assert main([*common, "--stage", "features"]) == 0
    assert len(list((work / "features-top8").glob("features-*.safetensors"))) == 1
    # the defaults: every anchor, length-grouped batches, top-8 distillation, and held-out
    # acceptance (greedy responses to 2 held-out prompts) logged at the last checkpoint
    train = ["--steps", "4", "--step-budget", "256", "--init-from", "28,29"]
    assert main([*common, "--stage", "train", *train, "--heldout-prompts", "2"]) == 0
    log = [json.loads(x) for x in (work / "train" / "train_log.jsonl").read_text().splitlines()]
    assert log[-2]["step"] == 4 and "loss" in log[-2]
    held = log[-1]["heldout"]  # k = 3 and 4: blocks of 4 and 5 trained in turn
    assert log[-1]["step"] == 4 and [h["k"] for h in held] == [3, 4]
    assert held[0]["anchors"] > 50 and len(held[0]["position_acceptance"]) == 3
    assert main([*common, "--stage", "export", "--out", str(out), "--eval-prompts", "2"]) == 0

    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == 256 and config["block_size"] == 5
    drafter = load_drafter(out)
    ids = set(drafter.draft_token_ids().tolist())
    assert tokenizer.eos_token_id in ids  # always in the draft vocabulary
    assert set(tokenizer.encode("def add(a, b):")) <= ids  # frequent response tokens are
    card = (out / "README.md").read_text()
    assert "Warm start: target layers 28,29." in card and "Trained 4 steps" in card
    assert [e["num_draft_tokens"] for e in json.loads((out / "eval.json").read_text())] == [3, 4]
    # --stage eval: the exported drafter's held-out acceptance, as training logged it
    capsys.readouterr()
    evaluate = ["--stage", "eval", "--drafter", str(out), "--heldout-prompts", "2"]
    assert main([*common, *evaluate]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [h["k"] for h in result["heldout"]] == [3, 4]
    assert result["heldout"][0]["anchors"] == held[0]["anchors"]
    assert abs(result["heldout"][0]["p1"] - held[0]["p1"]) <= 0.03  # bf16 export of fp32
    model = AutoModel.from_pretrained(out, trust_remote_code=True, dtype=torch.float32)
    assert torch.equal(model.d2t, drafter.d2t)
