"""Acceptance rules: greedy prefix matching and lossless rejection sampling (chi-square)."""

from __future__ import annotations

import itertools

import pytest
import torch

from dflash.sampling import SamplingParams, sample_from_probs, sampling_probs
from dflash.verify import accept, greedy_accept, speculative_accept

V, K, N = 5, 3, 60_000


def test_greedy_accept_table():
    drafts = torch.tensor([[1, 2, 3], [1, 9, 3], [7, 2, 3], [1, 2, 3]])
    target_tokens = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 0, 4]])
    logits = torch.nn.functional.one_hot(target_tokens, 10).float()
    num, nxt = greedy_accept(drafts, logits)
    assert num.tolist() == [3, 1, 0, 2]
    assert nxt.tolist() == [4, 2, 1, 0]


def test_sampling_probs_top_k_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    top_k = sampling_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (top_k[0, 2:] == 0).all() and torch.isclose(top_k.sum(), torch.tensor(1.0))
    top_p = sampling_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert top_p[0].tolist() == [1.0, 0.0, 0.0, 0.0]  # the top token alone holds >= 0.5


def _markov(seed: int, temperature_scale: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, V, generator=g) * temperature_scale  # logits[prev] -> next


def _run_speculative(target_logits, draft_logits, params, sampler, length=3, seed=0):
    """Emit `length` tokens per sequence for N sequences by repeated draft/verify steps."""
    g = torch.Generator().manual_seed(seed)
    out = [[] for _ in range(N)]
    last = torch.zeros(N, dtype=torch.long)
    while min(len(o) for o in out) < length:
        drafts, draft_probs, prev = [], [], last
        for _ in range(K):
            q = sampling_probs(draft_logits[prev], params)
            tok = sample_from_probs(q, g)
            drafts.append(tok)
            draft_probs.append(q)
            prev = tok
        drafts_t = torch.stack(drafts, dim=1)  # [N, K]
        chain = torch.cat([last[:, None], drafts_t], dim=1)  # [N, K+1]
        num, nxt = sampler(drafts_t, torch.stack(draft_probs, 1), target_logits[chain], params, g)
        for i in range(N):
            out[i].extend([*drafts_t[i, : num[i]].tolist(), int(nxt[i])])
        last = nxt
    return [tuple(o[:length]) for o in out]


def _chi_square_pvalue(samples, target_logits, params, length=3) -> float:
    p = sampling_probs(target_logits, params)  # [V, V]
    counts = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    stat, cells = 0.0, 0
    for seq in itertools.product(range(V), repeat=length):
        prob, prev = 1.0, 0
        for tok in seq:
            prob *= float(p[prev, tok])
            prev = tok
        expected = prob * len(samples)
        if expected < 5:  # pool nothing; skip cells too rare for the chi-square approximation
            continue
        stat += (counts.get(seq, 0) - expected) ** 2 / expected
        cells += 1
    dof = torch.tensor((cells - 1) / 2.0)
    return float(1 - torch.special.gammainc(dof, torch.tensor(stat / 2.0)))


def _lossless(drafts, draft_probs, target_logits, params, g):
    return accept(drafts, draft_probs, target_logits, params, g)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4, top_p=0.9)],
)
def test_speculative_sampling_matches_target_distribution(params):
    target, draft = _markov(0, 1.5), _markov(1, 1.5)
    samples = _run_speculative(target, draft, params, _lossless)
    assert _chi_square_pvalue(samples, target, params) > 1e-3


def test_chi_square_detects_a_biased_sampler():
    """Negative control: accepting every draft yields the draft's distribution, not the target's."""
    params = SamplingParams(temperature=1.0)
    target, draft = _markov(0, 1.5), _markov(1, 1.5)

    def take_drafts(drafts, draft_probs, target_logits, params, g):
        return torch.full((drafts.shape[0],), K), drafts[:, -1]

    samples = _run_speculative(target, draft, params, take_drafts)
    assert _chi_square_pvalue(samples, target, params) < 1e-6


def test_identical_draft_is_always_accepted():
    probs = torch.softmax(torch.randn(4, K + 1, V), dim=-1)
    drafts = sample_from_probs(probs[:, :K])
    num, _ = speculative_accept(drafts, probs[:, :K], probs)
    assert num.tolist() == [K] * 4


def test_accept_needs_draft_probs_when_sampling():
    with pytest.raises(ValueError, match="draft distribution"):
        accept(
            torch.zeros(1, K, dtype=torch.long), None, torch.zeros(1, K + 1, V), SamplingParams(1.0)
        )
