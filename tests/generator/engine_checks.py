"""Reference checks for engines, against a transformers forward pass in fp32: sampled log-probs
(max |Δ| ≤ LOGPROB_TOL), and per-token versions after an in-flight weight update."""

import numpy as np
import torch

LOGPROB_TOL = 1e-4


def chat_prompts(tok, n=6):
    from dapo_async.data.tasks import generate

    return [
        tok.apply_chat_template(
            r.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for r in generate("chain", "eval", n, 3, 0)
    ]


def forward_logprobs(model, prompt, tokens, temperature=1.0):
    """log π(token_t | prompt, tokens_<t) from one transformers forward pass."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    pos = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(tokens))
    return (
        torch.log_softmax(logits[pos], -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0].numpy()
    )


def max_delta(model, prompts, comps, temperature):
    worst = 0.0
    for prompt, per_prompt in zip(prompts, comps):
        for c in per_prompt:
            toks = c["tokens"] if isinstance(c, dict) else c.tokens.tolist()
            lps = np.asarray(c["logprobs"] if isinstance(c, dict) else c.logprobs)
            ref = forward_logprobs(model, prompt, toks, temperature)
            worst = max(worst, float(np.abs(ref - lps).max()))
    return worst


def perturbed(model, scale=0.05):
    """A copy of ``model``'s weights with noise: the 'new version' (noise per parameter, so
    tied embeddings stay tied)."""
    import copy

    new = copy.deepcopy(model)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(scale * torch.randn_like(p))
    return {k: v.clone() for k, v in new.state_dict().items()}


def logprob_at(state, model, prompt, tokens, t):
    """log π_state(tokens[t] | prompt, tokens[:t]) (temperature 1)."""
    model.load_state_dict(state)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(prompt) + list(tokens[:t])])).logits[0, -1]
    return float(torch.log_softmax(logits.float(), -1)[tokens[t]])


def check_versions_and_logprobs(prompts, results, states, model, exact_after_update: bool):
    """``results``: per prompt, its n=2 responses as dicts (tokens, logprobs, versions), decoded
    across one update from version ``old`` to ``new`` (``states``: {old: ..., new: ...})."""
    old, new = sorted(states)
    spanned = 0
    for prompt, comps in zip(prompts, results):
        assert len(comps) == 2, "every request returns its n responses"
        for c in comps:
            tokens, logps, versions = c["tokens"], c["logprobs"], c["versions"]
            assert versions == sorted(versions) and set(versions) <= {old, new}
            spanned += len(set(versions)) == 2
            for t, v in enumerate(versions):
                if v == new and not exact_after_update:
                    continue
                ref = logprob_at(states[v], model, prompt, tokens, t)
                assert abs(ref - logps[t]) <= LOGPROB_TOL, (t, v, ref, logps[t])
    assert spanned >= 2, "no response spanned the update"
