"""serve's sampling parameters against transformers' logits processors, through real clients (the `openai` package),
at TP 2 on a tiny real checkpoint (serve_fixture.py).

    python tests/inference/serve_sampling_test.py <build/bin>

For each case (greedy, so the draw is the argmax of the processed logits) transformers runs the same model step by
step with its own processors where it has them (SequenceBiasLogitsProcessor for logit_bias,
MinNewTokensLengthLogitsProcessor for min_tokens, RepetitionPenaltyLogitsProcessor for repetition_penalty) and
OpenAI's formula for frequency_penalty and presence_penalty (as vLLM applies them; transformers has none), in vLLM's
order. Checked:
  - the server's text equals transformers' decoded tokens, with the same finish_reason (a case stops before the
    first step whose two best processed logits are within 1e-3, where rounding may pick either);
  - logprobs: each token's log-probability (of the raw logits) equals transformers' log_softmax to 1e-4, and
    top_logprobs are the N most likely, the drawn one among them when it is the argmax; chat's logprobs.content too;
  - a streamed request's logprobs, joined, equal the plain one's;
  - n: greedy choices equal n=1's (usage counts them all); seeded sampled choices repeat, choice i equals n=1 with
    seed + i; chat's streamed choices, joined per index, equal the plain response's;
  - bad values get 400 naming the field.
Exit 1 on a failure; one line per check, then a `summary` line.
"""
import json
import math
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_fixture import Checks, WORDS, Server, make_checkpoint  # noqa: E402

TIE = 1e-3


check = Checks()


def hf_reference(model, torch, prompt_ids, params, max_tokens, eos):
    """transformers' processors, step by step: (tokens, raw logprobs of them, finish_reason, first near-tie step)."""
    from transformers.generation.logits_process import (MinNewTokensLengthLogitsProcessor,
                                                        RepetitionPenaltyLogitsProcessor, SequenceBiasLogitsProcessor)
    processors = []
    if params.get("logit_bias"):
        processors.append(SequenceBiasLogitsProcessor({(int(t),): float(b) for t, b in params["logit_bias"].items()}))
    if params.get("min_tokens"):
        processors.append(MinNewTokensLengthLogitsProcessor(len(prompt_ids), params["min_tokens"], eos))
    if params.get("repetition_penalty", 1.0) != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params["repetition_penalty"]))
    ids = list(prompt_ids)
    tokens, logprobs, tie = [], [], None
    with torch.no_grad():
        for step in range(max_tokens):
            raw = model(torch.tensor([ids])).logits[:, -1].float()
            scores = raw.clone()
            for proc in processors:
                scores = proc(torch.tensor([ids]), scores)
            out = torch.tensor(ids[len(prompt_ids):], dtype=torch.long)
            counts = torch.zeros(scores.shape[-1]).index_add_(0, out, torch.ones(len(out))) if len(out) else \
                torch.zeros(scores.shape[-1])
            scores = scores - params.get("frequency_penalty", 0.0) * counts - params.get("presence_penalty", 0.0) * (counts > 0)
            top2 = scores[0].topk(2).values
            if tie is None and float(top2[0] - top2[1]) < TIE:
                tie = step
            t = int(scores[0].argmax())
            tokens.append(t)
            logprobs.append(float(raw[0].log_softmax(-1)[t]))
            ids.append(t)
            if t == eos:
                return tokens, logprobs, "stop", tie
    return tokens, logprobs, "length", tie


def main():
    bin_dir = sys.argv[1]
    import openai
    import torch
    from transformers import LlamaForCausalLM
    root = tempfile.mkdtemp(prefix="serve_sampling_")
    model_dir, tok, _ = make_checkpoint(root, WORDS[:2], 2, clear_top1=False)
    name = os.path.basename(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    eos = tok.eos_token_id
    vocab = model.config.vocab_size
    server = Server(bin_dir, model_dir, tp=2)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120, max_retries=0)
        prompt = tok(WORDS[11])["input_ids"]
        plain, _, _, _ = hf_reference(model, torch, prompt, {}, 12, eos)
        t = str(plain[0])  # the unprocessed greedy first token: biased up, the penalties must push it back down
        # (label, params, the same without what is tested: the two must give different greedy tokens)
        cases = [
            ("repetition_penalty 3", {"logit_bias": {t: 4.0}, "repetition_penalty": 3.0}, {"logit_bias": {t: 4.0}}),
            ("repetition_penalty 0.5", {"repetition_penalty": 0.5}, {}),
            ("frequency_penalty 2", {"logit_bias": {t: 4.0}, "frequency_penalty": 2.0}, {"logit_bias": {t: 4.0}}),
            ("frequency_penalty -2", {"frequency_penalty": -2.0}, {}),
            ("presence_penalty 2", {"logit_bias": {t: 4.0}, "presence_penalty": 2.0}, {"logit_bias": {t: 4.0}}),
            ("presence_penalty -2", {"presence_penalty": -2.0}, {}),
            ("logit_bias", {"logit_bias": {str(prompt[0]): 8.0, "17": 4.5, str(vocab - 1): -100}}, {}),
            ("min_tokens 5 with EOS favoured", {"min_tokens": 5, "logit_bias": {str(eos): 60.0}},
             {"logit_bias": {str(eos): 60.0}}),
            ("all of them", {"min_tokens": 3, "logit_bias": {str(eos): 30.0, "42": 3.0}, "repetition_penalty": 1.2,
                             "frequency_penalty": 0.5, "presence_penalty": 0.5},
             {"logit_bias": {str(eos): 30.0, "42": 3.0}}),
        ]
        for label, params, without in cases:
            want, want_lp, reason, tie = hf_reference(model, torch, prompt, params, 12, eos)
            # Not vacuous: what is tested changes transformers' greedy tokens.
            base, _, _, _ = hf_reference(model, torch, prompt, without, 12, eos)
            check(want != base, f"{label}: changes transformers' greedy tokens", (want, base))
            steps = len(want) if tie is None else tie
            if steps == 0:
                check(False, f"{label}: a near-tie at the first step; choose another case", params)
                continue
            extra = dict(params)
            r = client.completions.create(model=name, prompt=prompt, max_tokens=steps, temperature=0, logprobs=2,
                                          extra_body=extra)
            c = r.choices[0]
            want_text = tok.decode(want[:steps], skip_special_tokens=True)
            want_reason = reason if steps == len(want) else "length"
            lps = c.logprobs.token_logprobs
            lp_err = max((abs(a - b) for a, b in zip(lps, want_lp)), default=1.0)
            tops_ok = all(len(t) <= 2 and max(t.values()) >= lp - 1e-6 for t, lp in zip(c.logprobs.top_logprobs, lps))
            check(c.text == want_text and c.finish_reason == want_reason and len(lps) == steps and lp_err < 1e-4
                  and tops_ok, f"{label}: {steps} greedy tokens equal transformers' processors', finish "
                               f"{c.finish_reason}, logprobs within {lp_err:.1e}",
                  (c.text, want_text, c.finish_reason, want_reason, lps, want_lp[:steps]))

        # Logprobs with top_logprobs, plain and streamed; chat's shape.
        want, want_lp, _, tie = hf_reference(model, torch, prompt, {}, 8, eos)
        steps = len(want) if tie is None else max(tie, 1)
        plain = client.completions.create(model=name, prompt=prompt, max_tokens=steps, temperature=0, logprobs=5)
        lp = plain.choices[0].logprobs
        top_ok = all(len(t) == 5 and math.isclose(max(t.values()), lpv, abs_tol=1e-5) for t, lpv in
                     zip(lp.top_logprobs, lp.token_logprobs))
        offsets_ok = lp.text_offset == [sum(len(x.encode()) for x in lp.tokens[:i]) for i in range(len(lp.tokens))]
        check(top_ok and offsets_ok and len(lp.tokens) == steps,
              "logprobs=5: five most likely per position, the greedy token the most likely, text_offset cumulative",
              lp)
        streamed = client.completions.create(model=name, prompt=prompt, max_tokens=steps, temperature=0, logprobs=5,
                                             stream=True)
        joined = [x for ch in streamed if ch.choices and ch.choices[0].logprobs for x in ch.choices[0].logprobs.token_logprobs]
        check(joined == lp.token_logprobs, "a streamed request's logprobs, joined, equal the plain one's",
              (joined, lp.token_logprobs))
        chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                              temperature=0, logprobs=True, top_logprobs=3)
        content = chat.choices[0].logprobs.content
        check(len(content) >= 1 and all(len(c.top_logprobs) == 3 and c.logprob <= 0 and c.bytes is not None
                                        for c in content),
              "chat logprobs: content entries with 3 top_logprobs each", content)

        # n choices: greedy ones all equal n=1's; sampled ones (seed s) are choice i = n=1 with seed s + i, and repeat.
        one = client.completions.create(model=name, prompt=prompt, max_tokens=6, temperature=0)
        three = client.completions.create(model=name, prompt=prompt, max_tokens=6, temperature=0, n=3)
        check([c.index for c in three.choices] == [0, 1, 2] and all(c.text == one.choices[0].text for c in three.choices)
              and three.usage.completion_tokens == 3 * one.usage.completion_tokens,
              "n=3 greedy: three choices, each n=1's text, usage counts all three", three)
        kw = dict(model=name, prompt=prompt, max_tokens=8, temperature=1.0, seed=7)
        four = [c.text for c in client.completions.create(n=4, **kw).choices]
        again = [c.text for c in client.completions.create(n=4, **kw).choices]
        singles = [client.completions.create(**dict(kw, seed=7 + i)).choices[0].text for i in range(4)]
        check(four == again and four == singles and len(set(four)) > 1,
              "n=4 sampled with a seed: repeats, choice i is n=1 with seed + i, not all the same", (four, again, singles))
        chunks = list(client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                                     temperature=0, n=2, stream=True))
        texts, ends = ["", ""], [None, None]
        for ch in chunks:
            for c in ch.choices:
                texts[c.index] += c.delta.content or ""
                ends[c.index] = c.finish_reason or ends[c.index]
        plain = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                               temperature=0, n=2)
        check(texts == [c.message.content for c in plain.choices] and None not in ends,
              "chat n=2 streamed: each choice's chunks, joined, equal the plain response's choice", (texts, ends, plain))

        # Bad values: 400 naming the field.
        bad = [("presence_penalty", {"presence_penalty": 3}), ("frequency_penalty", {"frequency_penalty": -2.5}),
               ("repetition_penalty", {"repetition_penalty": 0}), ("logit_bias", {"logit_bias": {"abc": 1}}),
               ("logit_bias", {"logit_bias": {str(vocab): 1}}), ("logit_bias", {"logit_bias": {"5": 101}}),
               ("min_tokens", {"min_tokens": 9}), ("min_tokens", {"min_tokens": -1}), ("logprobs", {"logprobs": 21}),
               ("n", {"n": 65}), ("n", {"n": 0}), ("best_of", {"best_of": 2})]
        for field, params in bad:
            try:
                client.completions.create(model=name, prompt=prompt, max_tokens=4, extra_body=params)
                got = None
            except openai.BadRequestError as e:
                got = e.body.get("param") if isinstance(e.body, dict) else None
            check(got == field, f"bad value {params}: 400 naming '{field}'", got)
        try:
            client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                           top_logprobs=2)
            got = None
        except openai.BadRequestError as e:
            got = e.body.get("param") if isinstance(e.body, dict) else None
        check(got == "top_logprobs", "chat top_logprobs without logprobs: 400", got)
    finally:
        server.stop()
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
