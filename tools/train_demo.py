#!/usr/bin/env python3
"""Train Strata's demo model (models/demo): a small DeepSeek-V3.2 (`deepseek_v32`) model with
its own byte-level BPE tokenizer, trained on the Python documentation text that
tools/extract_corpus.py writes to corpus/.

Runs on the GPU machine (Python 3.12, torch 2.11, transformers 5.17, tokenizers 0.23,
safetensors); the whole run takes a few minutes on one H200. Steps:

 1. Tokenizer: byte-level BPE trained with `tokenizers` in the style of DeepSeek-V3's
    tokenizer.json (its three Split regexes + ByteLevel, ByteLevel decoder, a
    TemplateProcessing post-processor that prepends BOS). Special tokens:
    <｜begin▁of▁sentence｜> (0, BOS), <｜end▁of▁sentence｜> (1, EOS), <｜User｜> (2),
    <｜Assistant｜> (3).
 2. Data: every document is encoded and followed by EOS; the documents are concatenated into
    one token stream. A training or evaluation window is BOS followed by CTX-1 stream tokens.
 3. Model: transformers' DeepseekV32ForCausalLM (MLA, MoE with expert groups and a shared
    expert, the DSA lightning indexer with index_topk < CTX). Training reaches into the
    attention modules: their forward is replaced by one that computes the same MLA math
    (checked against transformers' own forward before training and after it) and can run
    (a) dense attention, (b) dense attention that also exposes its probabilities,
    (c) DSA: attention restricted to the indexer's top-k keys.
    Phase 1, dense warm-up: the whole model except the indexer, dense attention, LM loss.
    Phase 2, indexer warm-up: everything frozen except the indexers, each trained with
    KL(p || softmax(I)), p = the layer's dense attention summed over heads and L1-normalised
    (detached), I = the indexer's causal scores.
    Phase 3, sparse training: DSA on (top-k from the indexer; the selection passes no
    gradient), LM loss for the main model, and the indexer's KL loss restricted to the
    selected keys, its inputs detached (the two losses touch disjoint parameters).
    The MoE routers are balanced without an auxiliary loss, as in DeepSeek-V3: after each
    step every expert's selection bias moves by --bias-rate towards the mean load.
 4. Evaluation, with transformers' unmodified forward on the saved BF16 weights loaded into
    a float32 model (eager attention, no TF32): held-out perplexity with DSA (the real
    index_topk) and dense (index_topk >= CTX), against a unigram model (training-split token
    frequencies, add-one smoothing) on the same target tokens; the oracle for the C++ engine:
    the mean NLL of one fixed held-out sequence of CTX tokens (tokenizer(text), BOS
    included), computed on the CPU.
 5. Output (--stage, mirroring the repository): models/demo/{config.json,
    generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
    training_metrics.json, loss.png} and tests/data/demo_heldout.json, packed into --tar.

Usage (repository root of the GPU machine, corpus/ carried along):
  PYTHONUNBUFFERED=1 python3 tools/train_demo.py --tar "$OUT/demo.tar.gz"
"""

import argparse
import json
import math
import os
import re
import sys
import tarfile
import time
import types

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Regex, Tokenizer  # noqa: E402
from tokenizers import (decoders, models, normalizers, pre_tokenizers,  # noqa: E402
                        processors, trainers)

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
SPECIALS = [BOS, EOS, USER, ASSISTANT]
BOS_ID, EOS_ID = 0, 1

# DeepSeek-V3's pre-tokenizer: three Split(Isolated) regexes (the third holds literal CR/LF
# characters inside its classes, as the published tokenizer.json does), then ByteLevel.
DS_SPLIT_PATTERNS = [
    "\\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
    "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

DOC_SEPARATOR = "\n\x0c\n"


# --------------------------------------------------------------------------------- arguments


def parse_args():
    ap = argparse.ArgumentParser(description="Train the demo deepseek_v32 model.")
    ap.add_argument("--corpus", default="corpus")
    ap.add_argument("--stage", default="out/demo_stage",
                    help="where the repository files are written before packing")
    ap.add_argument("--tar", default="", help="pack the staged files into this .tar.gz")
    ap.add_argument("--state-out", default="",
                    help="also write the trained float32 state and tokenizer here")
    ap.add_argument("--resume", default="",
                    help="skip training: load state.pt and tokenizer.json from this directory")
    ap.add_argument("--seed", type=int, default=1234)
    # tokenizer / data
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    # model
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--q-lora", type=int, default=96)
    ap.add_argument("--kv-lora", type=int, default=64)
    ap.add_argument("--nope", type=int, default=32)
    ap.add_argument("--rope", type=int, default=16)
    ap.add_argument("--v-dim", type=int, default=32)
    ap.add_argument("--dense-inter", type=int, default=512)
    ap.add_argument("--moe-inter", type=int, default=64)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--n-group", type=int, default=4)
    ap.add_argument("--topk-group", type=int, default=2)
    ap.add_argument("--experts-per-tok", type=int, default=2)
    ap.add_argument("--index-topk", type=int, default=128)
    ap.add_argument("--index-heads", type=int, default=8)
    ap.add_argument("--index-dim", type=int, default=32)
    ap.add_argument("--max-pos", type=int, default=4096)
    ap.add_argument("--max-mb", type=float, default=7.0, help="model.safetensors size limit")
    # training
    ap.add_argument("--steps1", type=int, default=1600)
    ap.add_argument("--steps2", type=int, default=300)
    ap.add_argument("--steps3", type=int, default=300)
    ap.add_argument("--budget1", type=float, default=170.0, help="phase 1 seconds at most")
    ap.add_argument("--budget2", type=float, default=35.0)
    ap.add_argument("--budget3", type=float, default=60.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--lr-index", type=float, default=3e-3)
    ap.add_argument("--lr3", type=float, default=2e-4)
    ap.add_argument("--lr-index3", type=float, default=5e-4)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--oracle-doc", default="tutorial/introduction.html")
    return ap.parse_args()


# --------------------------------------------------------------------------------- tokenizer


def build_tokenizer(docs, vocab_size):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
         for p in DS_SPLIT_PATTERNS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=[tokenizers.AddedToken(s, special=True, normalized=False)
                        for s in SPECIALS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, BOS_ID)])
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def tokenizer_config(ctx_max):
    return {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": EOS,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": ctx_max,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


# --------------------------------------------------------------------------------- model math

STATE = types.SimpleNamespace(
    mode="hf",  # "dense" | "dense_probs" | "sparse" | "probe" (patched); "hf" = not patched
    kl=False,  # collect the indexer KL loss
    kl_terms=[],
    probe=[],  # per-layer captured top-k attention mass ("probe" mode)
    count_experts=False,
    counts={},
)
CAUSAL = {}


def causal_mask(S, device):
    key = (S, str(device))
    if key not in CAUSAL:
        CAUSAL[key] = torch.ones(S, S, dtype=torch.bool, device=device).tril()
    return CAUSAL[key]


def rope_interleaved(x, cos, sin):
    """MLA rope: pairs (2i, 2i+1), output de-interleaved like transformers. x [B,h,S,dr]."""
    half = cos.shape[-1] // 2
    c = cos[..., :half].unsqueeze(1)
    s = sin[..., :half].unsqueeze(1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def index_scores(ix, x, q_resid, cos, sin, cfg):
    """DSA indexer scores I[b,t,u] (float32, no mask), as DeepseekV32Indexer computes them."""
    ni, di, dr = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
    B, S, _ = x.shape
    with torch.autocast(device_type=x.device.type, enabled=False):
        x = x.float()
        q = ix.wq_b(q_resid.float()).view(B, S, ni, di)
        q_rot, q_pass = q.split([dr, di - dr], dim=-1)
        k = ix.k_norm(ix.wk(x))
        k_rot, k_pass = k.split([dr, di - dr], dim=-1)
        c, s = cos.float(), sin.float()
        q_rot = q_rot * c.unsqueeze(2) + rotate_half(q_rot) * s.unsqueeze(2)
        k_rot = k_rot * c + rotate_half(k_rot) * s
        q = torch.cat([q_rot, q_pass], dim=-1)
        k = torch.cat([k_rot, k_pass], dim=-1)
        scores = F.relu(torch.einsum("bshd,btd->bsht", q, k) * di ** -0.5)
        w = ix.weights_proj(x).float() * ni ** -0.5
        return torch.einsum("bsh,bsht->bst", w, scores)


def make_attention_forward(cfg):
    nh, dn, dr, dv = (cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                      cfg.v_head_dim)
    C = cfg.kv_lora_rank
    default_scale = (dn + dr) ** -0.5

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        B, S, _ = hidden_states.shape
        cos, sin = position_embeddings
        q_resid = self.q_a_layernorm(self.q_a_proj(hidden_states))
        q = self.q_b_proj(q_resid).view(B, S, nh, dn + dr).transpose(1, 2)
        q_nope, q_rot = q.split([dn, dr], dim=-1)
        ckv = self.kv_a_proj_with_mqa(hidden_states)
        c, k_rot = ckv.split([C, dr], dim=-1)
        c = self.kv_a_layernorm(c)
        k_rot = k_rot.reshape(B, 1, S, dr)
        q_rot = rope_interleaved(q_rot, cos, sin)
        k_rot = rope_interleaved(k_rot, cos, sin)
        kv = self.kv_b_proj(c).view(B, S, nh, dn + dv).transpose(1, 2)
        k_nope, v = kv.split([dn, dv], dim=-1)
        query = torch.cat([q_nope, q_rot], dim=-1)
        key = torch.cat([k_nope, k_rot.expand(B, nh, S, dr).to(k_nope.dtype)], dim=-1)
        scale = getattr(self, "scaling", default_scale)
        mode = STATE.mode

        if mode == "dense" and not STATE.kl:
            out = F.scaled_dot_product_attention(query, key.to(query.dtype), v.to(query.dtype),
                                                 is_causal=True, scale=scale)
        else:
            causal = causal_mask(S, hidden_states.device)
            I = None
            if mode in ("sparse", "probe") or STATE.kl:
                ctx = torch.enable_grad() if STATE.kl else torch.no_grad()
                with ctx:
                    I = index_scores(self.indexer, hidden_states.detach(), q_resid.detach(),
                                     cos, sin, cfg)
            allowed = causal.unsqueeze(0).expand(B, S, S)
            sel = None
            if mode in ("sparse", "probe"):
                k = min(cfg.index_topk, S)
                with torch.no_grad():
                    idx = I.detach().masked_fill(~causal, float("-inf")).topk(k, dim=-1).indices
                    sel = torch.zeros(B, S, S, dtype=torch.bool, device=I.device)
                    sel.scatter_(-1, idx, True)
                    sel &= causal
                if mode == "sparse":
                    allowed = sel
            logits = torch.matmul(query, key.transpose(-1, -2).to(query.dtype)).float() * scale
            logits = logits.masked_fill(~allowed.unsqueeze(1), float("-inf"))
            probs = logits.softmax(dim=-1)
            out = torch.matmul(probs.to(v.dtype), v)
            if mode == "probe":
                with torch.no_grad():
                    mass = (probs.mean(1) * sel).sum(-1)  # [B,S]
                    rows = mass[:, cfg.index_topk:]
                    if rows.numel():
                        STATE.probe.append(rows.mean().item())
            if STATE.kl:
                with torch.no_grad():
                    target = probs.detach().sum(1)
                    target = target / target.sum(-1, keepdim=True).clamp_min(1e-20)
                with torch.enable_grad():
                    li = I.masked_fill(~allowed, -1e30).log_softmax(dim=-1)
                    kl = (target * (target.clamp_min(1e-30).log() - li)).masked_fill(
                        ~allowed, 0.0).sum(-1).mean()
                STATE.kl_terms.append(kl)
        out = out.transpose(1, 2).reshape(B, S, nh * dv)
        return self.o_proj(out), None

    return forward


def attention_modules(model):
    return [layer.self_attn for layer in model.model.layers]


def patch(model):
    fwd = make_attention_forward(model.config)
    for m in attention_modules(model):
        m.forward = types.MethodType(fwd, m)


def unpatch(model):
    for m in attention_modules(model):
        if "forward" in m.__dict__:
            del m.forward


def install_router_hooks(model):
    n = 0
    for li, layer in enumerate(model.model.layers):
        gate = getattr(layer.mlp, "gate", None)
        if gate is None or not hasattr(gate, "e_score_correction_bias"):
            continue

        def hook(mod, inp, out, li=li):
            if not STATE.count_experts:
                return
            outs = out if isinstance(out, (tuple, list)) else (out,)
            for t in outs:
                if isinstance(t, torch.Tensor) and t.dtype in (torch.int64, torch.int32):
                    c = torch.bincount(t.reshape(-1).long(),
                                       minlength=mod.e_score_correction_bias.numel())
                    STATE.counts[li] = STATE.counts.get(li, 0) + c
                    return

        gate.register_forward_hook(hook)
        n += 1
    return n


@torch.no_grad()
def update_router_bias(model, rate):
    for li, counts in STATE.counts.items():
        gate = model.model.layers[li].mlp.gate
        load = counts.float()
        gate.e_score_correction_bias.add_(rate * torch.sign(load.mean() - load))
    STATE.counts = {}


# --------------------------------------------------------------------------------- helpers


def lm_nll(logits, tokens):
    """Per-window summed NLL and count over positions 1.. (natural log)."""
    lp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    tgt = tokens[:, 1:]
    nll = -lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    return nll


def cosine(step, total, peak, floor_frac, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def set_lr(opt, lr):
    for g in opt.param_groups:
        g["lr"] = lr


def param_groups(params, wd):
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def cuda_sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def no_tf32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


# --------------------------------------------------------------------------------- main


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers "
        f"{tokenizers.__version__}, device "
        f"{torch.cuda.get_device_name(0) if dev.type == 'cuda' else 'cpu'}")
    metrics = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "tokenizers": tokenizers.__version__,
                            "python": sys.version.split()[0]},
               "args": {k: (os.path.basename(os.path.normpath(v))
                            if k in ("tar", "state_out") and v else v)
                        for k, v in vars(args).items()},
               "warnings": []}

    def warn(msg):
        log("WARNING: " + msg)
        metrics["warnings"].append(msg)

    # ---- corpus
    with open(os.path.join(args.corpus, "train.txt"), encoding="utf-8") as f:
        train_docs = [d for d in f.read().split(DOC_SEPARATOR) if d.strip()]
    with open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8") as f:
        held_docs = [d for d in f.read().split(DOC_SEPARATOR) if d.strip()]
    held_names = [f"doc{i}" for i in range(len(held_docs))]
    man_path = os.path.join(args.corpus, "manifest.json")
    if os.path.exists(man_path):
        with open(man_path) as f:
            man = json.load(f)
        if len(man.get("heldout_pages", [])) == len(held_docs):
            held_names = man["heldout_pages"]
        metrics["corpus"] = {"source": man.get("source"), "licence": man.get("licence"),
                             "heldout_rule": man.get("heldout_rule"),
                             "heldout_pages": man.get("heldout_pages"), "bytes": man.get("bytes")}
    log(f"corpus: {len(train_docs)} train docs ({sum(map(len, train_docs)) / 1e6:.2f} M chars), "
        f"{len(held_docs)} held-out docs ({sum(map(len, held_docs)) / 1e6:.2f} M chars)")

    # ---- tokenizer
    t = time.time()
    if args.resume:
        tok = Tokenizer.from_file(os.path.join(args.resume, "tokenizer.json"))
    else:
        tok = build_tokenizer(train_docs, args.vocab)
    V = tok.get_vocab_size()
    log(f"tokenizer trained: vocab {V} in {time.time() - t:.1f}s")
    stage = args.stage
    mdir = os.path.join(stage, "models", "demo")
    os.makedirs(mdir, exist_ok=True)
    os.makedirs(os.path.join(stage, "tests", "data"), exist_ok=True)
    tok.save(os.path.join(mdir, "tokenizer.json"), pretty=True)
    with open(os.path.join(mdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(args.max_pos), f, indent=2, ensure_ascii=False)
        f.write("\n")

    def encode_stream(docs):
        encs = tok.encode_batch(docs, add_special_tokens=False)
        ids = []
        for e in encs:
            ids.extend(e.ids)
            ids.append(EOS_ID)
        return np.asarray(ids, dtype=np.int64)

    t = time.time()
    train_ids = encode_stream(train_docs)
    held_ids = encode_stream(held_docs)
    n_chars = sum(len(d) for d in train_docs)
    log(f"encoded: {len(train_ids)} train tokens ({n_chars / len(train_ids):.2f} chars/token), "
        f"{len(held_ids)} held-out tokens, {time.time() - t:.1f}s")
    metrics["data"] = {"train_tokens": int(len(train_ids)), "heldout_tokens": int(len(held_ids)),
                       "chars_per_token": n_chars / len(train_ids), "vocab_size": V}

    L = args.ctx - 1
    n_win = len(held_ids) // L
    held_windows = np.concatenate(
        [np.full((n_win, 1), BOS_ID, dtype=np.int64), held_ids[: n_win * L].reshape(n_win, L)], 1)
    held_windows_t = torch.from_numpy(held_windows).to(dev)
    train_stream = torch.from_numpy(train_ids).to(dev)

    # unigram baseline on exactly the targets the model is scored on
    counts = np.bincount(train_ids, minlength=V).astype(np.float64)
    uni_p = (counts + 1.0) / (counts.sum() + V)
    targets = held_windows[:, 1:].reshape(-1)
    uni_nll = float(-np.log(uni_p[targets]).mean())
    log(f"unigram (add-one) held-out: nll {uni_nll:.4f}, ppl {math.exp(uni_nll):.2f} over "
        f"{targets.size} targets in {n_win} windows of {args.ctx}")

    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)
    arange_L = torch.arange(L, device=dev)
    bos_col = torch.full((args.batch, 1), BOS_ID, dtype=torch.long, device=dev)

    def batch():
        off = torch.randint(0, len(train_ids) - L, (args.batch,), device=dev, generator=gen)
        return torch.cat([bos_col, train_stream[off[:, None] + arange_L]], dim=1)

    # ---- model
    cfg = transformers.DeepseekV32Config(
        vocab_size=V, hidden_size=args.hidden, intermediate_size=args.dense_inter,
        moe_intermediate_size=args.moe_inter, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.heads,
        n_shared_experts=1, n_routed_experts=args.experts, routed_scaling_factor=2.5,
        kv_lora_rank=args.kv_lora, q_lora_rank=args.q_lora, qk_rope_head_dim=args.rope,
        qk_nope_head_dim=args.nope, v_head_dim=args.v_dim, n_group=args.n_group,
        topk_group=args.topk_group, num_experts_per_tok=args.experts_per_tok,
        norm_topk_prob=True, first_k_dense_replace=1, hidden_act="silu",
        max_position_embeddings=args.max_pos, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        index_topk=args.index_topk, index_n_heads=args.index_heads,
        index_head_dim=args.index_dim, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
        pad_token_id=None, tie_word_embeddings=False, attention_bias=False,
        initializer_range=0.02, attn_implementation="eager", experts_implementation="eager")
    cfg._attn_implementation = "eager"
    torch.manual_seed(args.seed)
    model = transformers.DeepseekV32ForCausalLM(cfg).to(dev)
    model.config.use_cache = False
    n_params = sum(p.numel() for p in model.parameters())
    n_index = sum(p.numel() for n, p in model.named_parameters() if ".indexer." in n)
    n_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    est_mb = (n_params * 2 + sum(b.numel() * 4 for n, b in model.named_buffers()
                                 if "e_score_correction_bias" in n)) / 1e6
    log(f"model: {n_params} parameters ({n_index} indexer, {n_expert} routed experts), "
        f"~{est_mb:.2f} MB in BF16; layers mlp {cfg.mlp_layer_types}")
    metrics["model"] = {"parameters": n_params, "indexer_parameters": n_index,
                        "routed_expert_parameters": n_expert, "bf16_megabytes_estimate": est_mb,
                        "mlp_layer_types": list(cfg.mlp_layer_types)}
    if est_mb > args.max_mb:
        warn(f"model estimate {est_mb:.2f} MB exceeds {args.max_mb} MB")
    n_hooks = install_router_hooks(model)
    log(f"router hooks on {n_hooks} MoE layers")
    if n_hooks == 0:
        warn("no router hooks: expert balancing off")

    # ---- preflight: patched forward == transformers' forward (T <= index_topk: DSA is dense)
    no_tf32()
    model.eval()
    with torch.no_grad():
        x = held_windows_t[:2, : min(args.ctx, args.index_topk)]
        unpatch(model)
        STATE.mode = "hf"
        ref = model(input_ids=x).logits.float()
        patch(model)
        diffs = {}
        for mode in ("dense", "sparse", "dense_probs"):
            STATE.mode = mode
            diffs[mode] = (model(input_ids=x).logits.float() - ref).abs().max().item()
    scale = ref.abs().max().item()
    log(f"preflight (T={x.shape[1]}): max |logit diff| vs transformers {diffs}, "
        f"max |logit| {scale:.3g}")
    metrics["preflight_max_abs_logit_diff"] = diffs
    if max(diffs.values()) > 1e-3 * max(scale, 1.0):
        warn(f"patched attention differs from transformers' forward: {diffs}")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    main_params = [p for n, p in model.named_parameters() if ".indexer." not in n]
    index_params = [p for n, p in model.named_parameters() if ".indexer." in n]
    curve = []
    amp = dict(device_type=dev.type, dtype=torch.bfloat16)

    def quick_eval(mode, n=24):
        model.eval()
        STATE.mode = mode
        tot, cnt = 0.0, 0
        with torch.no_grad(), torch.autocast(**amp):
            for i in range(0, min(n, n_win), 8):
                xb = held_windows_t[i:min(i + 8, n, n_win)]
                nll = lm_nll(model(input_ids=xb).logits, xb)
                tot += nll.sum().item()
                cnt += nll.numel()
        model.train()
        return tot / max(cnt, 1)

    def set_trainable(main, index):
        for p in main_params:
            p.requires_grad_(main)
        for p in index_params:
            p.requires_grad_(index)

    def measure_and_plan(phase, done, total, budget_left, step_times):
        """New total step count so that the remaining steps fit the phase's time budget."""
        rate = float(np.median(step_times))
        planned = done + max(1, min(total - done, int(budget_left / rate)))
        if planned < total:
            warn(f"phase {phase}: {rate * 1000:.0f} ms/step, steps cut {total} -> {planned} "
                 f"to fit its time budget")
        return planned, rate

    if args.resume:
        sd = torch.load(os.path.join(args.resume, "state.pt"), map_location=dev)
        model.load_state_dict(sd["model"])
        for n, b in model.named_buffers():
            if n in sd["buffers"]:
                b.copy_(sd["buffers"][n])
        curve = sd.get("curve", [])
        for k in ("phase1", "phase2", "phase3", "after_phase2_subset"):
            if k in sd.get("metrics", {}):
                metrics[k] = sd["metrics"][k]
        metrics["resumed_from_state"] = True
        log(f"resumed trained weights from {args.resume}; training skipped")
        opt = opt_ix = None
    else:
        # ---- phase 1: dense warm-up of the whole model (indexer untouched)
        set_trainable(True, False)
        opt = torch.optim.AdamW(param_groups(main_params, args.wd), lr=args.lr, betas=(0.9, 0.95),
                                eps=1e-8, fused=dev.type == "cuda")
        model.train()
        STATE.mode, STATE.kl = "dense", False
        steps1, times, ema = args.steps1, [], None
        t_phase = time.time()
        step = 0
        while step < steps1:
            ts = time.time()
            lr = cosine(step, steps1, args.lr, 0.1, args.warmup)
            set_lr(opt, lr)
            xb = batch()
            STATE.count_experts = True
            with torch.autocast(**amp):
                loss = lm_nll(model(input_ids=xb).logits, xb).mean()
            STATE.count_experts = False
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(main_params, 1.0)
            opt.step()
            update_router_bias(model, args.bias_rate)
            step += 1
            if step % 10 == 0 or step == 1:
                lv = loss.item()
                ema = lv if ema is None else 0.9 * ema + 0.1 * lv
                curve.append({"phase": 1, "step": step, "loss": lv, "lr": lr,
                              "grad_norm": float(gn), "t": time.time() - T0})
            if 5 <= step < 35:
                cuda_sync()
                times.append(time.time() - ts)
            if step == 35:
                steps1, rate = measure_and_plan(1, step, steps1,
                                                args.budget1 - (time.time() - t_phase), times)
                log(f"phase 1: {rate * 1000:.1f} ms/step -> {steps1} steps")
            if step % 200 == 0 or step == steps1:
                hl = quick_eval("dense")
                curve.append({"phase": 1, "step": step, "heldout_loss_dense": hl,
                              "t": time.time() - T0})
                log(f"phase 1 step {step}/{steps1}: loss {loss.item():.4f} (ema {ema:.4f}) "
                    f"held-out {hl:.4f} lr {lr:.2e} |g| {float(gn):.2f}")
                STATE.mode = "dense"
        cuda_sync()
        metrics["phase1"] = {"steps": step, "seconds": time.time() - t_phase,
                             "tokens": step * args.batch * args.ctx}
        log(f"phase 1 done: {step} steps, {time.time() - t_phase:.1f}s")

        # ---- phase 2: indexer warm-up (KL to the dense attention distribution), rest frozen
        set_trainable(False, True)
        opt_ix = torch.optim.AdamW(param_groups(index_params, 0.0), lr=args.lr_index,
                                   betas=(0.9, 0.95), fused=dev.type == "cuda")
        STATE.mode, STATE.kl = "dense_probs", True
        model.eval()
        steps2, times = args.steps2, []
        t_phase = time.time()
        step = 0
        while step < steps2:
            ts = time.time()
            lr = cosine(step, steps2, args.lr_index, 0.1, 20)
            set_lr(opt_ix, lr)
            xb = batch()
            STATE.kl_terms = []
            with torch.no_grad(), torch.autocast(**amp):
                model(input_ids=xb)
            kl = torch.stack(STATE.kl_terms).sum()
            opt_ix.zero_grad(set_to_none=True)
            kl.backward()
            torch.nn.utils.clip_grad_norm_(index_params, 1.0)
            opt_ix.step()
            step += 1
            if step % 10 == 0 or step == 1:
                curve.append({"phase": 2, "step": step, "kl": kl.item(),
                              "kl_per_layer": [k.item() for k in STATE.kl_terms], "lr": lr,
                              "t": time.time() - T0})
            if 3 <= step < 13:
                cuda_sync()
                times.append(time.time() - ts)
            if step == 13:
                steps2, rate = measure_and_plan(2, step, steps2,
                                                args.budget2 - (time.time() - t_phase), times)
                log(f"phase 2: {rate * 1000:.1f} ms/step -> {steps2} steps")
            if step % 50 == 0 or step == steps2:
                log(f"phase 2 step {step}/{steps2}: KL {kl.item():.4f} per layer "
                    f"{[round(k.item(), 3) for k in STATE.kl_terms]}")
        STATE.kl, STATE.kl_terms = False, []
        cuda_sync()
        metrics["phase2"] = {"steps": step, "seconds": time.time() - t_phase,
                             "final_kl": kl.item()}
        hl_dense = quick_eval("dense")
        hl_sparse = quick_eval("sparse")
        log(f"after phase 2: held-out (subset) dense {hl_dense:.4f}, sparse {hl_sparse:.4f}")
        metrics["after_phase2_subset"] = {"dense": hl_dense, "sparse": hl_sparse}

        # ---- phase 3: sparse training (DSA on), main LM loss + indexer KL on the selected keys
        set_trainable(True, True)
        opt_ix = torch.optim.AdamW(param_groups(index_params, 0.0), lr=args.lr_index3,
                                   betas=(0.9, 0.95), fused=dev.type == "cuda")
        STATE.mode, STATE.kl = "sparse", True
        model.train()
        steps3, times = args.steps3, []
        t_phase = time.time()
        step = 0
        while step < steps3:
            ts = time.time()
            lr = cosine(step, steps3, args.lr3, 0.1, 10)
            set_lr(opt, lr)
            set_lr(opt_ix, args.lr_index3)
            xb = batch()
            STATE.kl_terms = []
            STATE.count_experts = True
            with torch.autocast(**amp):
                loss = lm_nll(model(input_ids=xb).logits, xb).mean()
            STATE.count_experts = False
            kl = torch.stack(STATE.kl_terms).sum()
            opt.zero_grad(set_to_none=True)
            opt_ix.zero_grad(set_to_none=True)
            (loss + kl).backward()
            gn = torch.nn.utils.clip_grad_norm_(main_params, 1.0)
            torch.nn.utils.clip_grad_norm_(index_params, 1.0)
            opt.step()
            opt_ix.step()
            update_router_bias(model, args.bias_rate)
            step += 1
            if step % 10 == 0 or step == 1:
                curve.append({"phase": 3, "step": step, "loss": loss.item(), "kl": kl.item(),
                              "lr": lr, "grad_norm": float(gn), "t": time.time() - T0})
            if 3 <= step < 13:
                cuda_sync()
                times.append(time.time() - ts)
            if step == 13:
                steps3, rate = measure_and_plan(3, step, steps3,
                                                args.budget3 - (time.time() - t_phase), times)
                log(f"phase 3: {rate * 1000:.1f} ms/step -> {steps3} steps")
            if step % 50 == 0 or step == steps3:
                log(f"phase 3 step {step}/{steps3}: loss {loss.item():.4f} KL {kl.item():.4f}")
        STATE.kl, STATE.kl_terms = False, []
        cuda_sync()
        metrics["phase3"] = {"steps": step, "seconds": time.time() - t_phase,
                             "tokens": step * args.batch * args.ctx}
        metrics["train_seconds"] = time.time() - T0
        log("training done")

        if args.state_out:
            os.makedirs(args.state_out, exist_ok=True)
            torch.save({"model": model.state_dict(),
                        "buffers": {n: b for n, b in model.named_buffers()
                                    if "e_score_correction_bias" in n},
                        "curve": curve,
                        "metrics": {k: metrics[k] for k in ("phase1", "phase2", "phase3",
                                                            "after_phase2_subset")}},
                       os.path.join(args.state_out, "state.pt"))
            tok.save(os.path.join(args.state_out, "tokenizer.json"), pretty=False)
            log(f"trained float32 state written to {args.state_out}")

    try:
        # ---- post-training check of the patched forward against transformers (f32, DSA active)
        no_tf32()
        model.eval()
        with torch.no_grad():
            xb = held_windows_t[:4]
            unpatch(model)
            STATE.mode = "hf"
            ref = model(input_ids=xb).logits.float()
            ref_nll = lm_nll(ref, xb).mean().item()
            patch(model)
            STATE.mode = "sparse"
            got = model(input_ids=xb).logits.float()
            got_nll = lm_nll(got, xb).mean().item()
        d = (got - ref).abs().max().item()
        log(f"post-training check (T={args.ctx}, DSA): max |logit diff| {d:.3g}, NLL transformers "
            f"{ref_nll:.5f} vs patched {got_nll:.5f}")
        metrics["posttrain_check"] = {"max_abs_logit_diff": d, "nll_transformers": ref_nll,
                                      "nll_patched": got_nll}
        if abs(ref_nll - got_nll) > 1e-3 * abs(ref_nll):
            warn("patched sparse forward disagrees with transformers after training")

        # ---- save BF16 weights with transformers' save_pretrained
        unpatch(model)
        STATE.mode = "hf"
        biases = {n: b.detach().float().clone() for n, b in model.named_buffers()
                  if n.endswith("e_score_correction_bias")}
        save_model = transformers.DeepseekV32ForCausalLM(cfg)
        save_model.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
        save_model = save_model.to(torch.bfloat16)
        for n, b in biases.items():
            mod = save_model.get_submodule(n.rsplit(".", 1)[0])
            mod.e_score_correction_bias = b.cpu()
        save_model.config.use_cache = True
        save_model.save_pretrained(mdir, safe_serialization=True)
        del save_model
        gcfg = transformers.GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID)
        gcfg.save_pretrained(mdir)
        st_path = os.path.join(mdir, "model.safetensors")
        fix_expert_layout(st_path, cfg, warn)
        size = os.path.getsize(st_path)
        log(f"saved {mdir}: model.safetensors {size / 1e6:.3f} MB; "
            f"files {sorted(os.listdir(mdir))}")
        metrics["model"]["safetensors_bytes"] = size
        if size > args.max_mb * 1e6:
            warn(f"model.safetensors is {size / 1e6:.2f} MB > {args.max_mb} MB")
        metrics["model"]["tensors"] = describe_safetensors(st_path)

        # ---- evaluation with transformers' own forward on the saved weights (float32)
        del model, opt, opt_ix
        torch.cuda.empty_cache()
        ev = {}
        models_f32 = {}
        for name, topk in (("sparse", None), ("dense", 1 << 20)):
            c = transformers.DeepseekV32Config.from_pretrained(mdir)
            if topk is not None:
                c.index_topk = topk
            m = transformers.DeepseekV32ForCausalLM.from_pretrained(
                mdir, config=c, dtype=torch.float32, attn_implementation="eager",
                experts_implementation="eager").to(dev).eval()
            models_f32[name] = m
            if name == "sparse":
                install_router_hooks(m)
                STATE.counts, STATE.count_experts = {}, True
            tot = []
            with torch.no_grad():
                for i in range(0, n_win, 16):
                    xb = held_windows_t[i:i + 16]
                    lg = m(input_ids=xb, use_cache=False).logits
                    tot.append(lm_nll(lg, xb).reshape(-1).double().cpu())
            nll = torch.cat(tot).mean().item()
            ev[name] = {"mean_nll": nll, "perplexity": math.exp(nll)}
            if name == "sparse":
                STATE.count_experts = False
                ev["expert_load_fraction"] = {
                    str(li): [round(v, 4) for v in (cnt.float() / cnt.sum()).tolist()]
                    for li, cnt in sorted(STATE.counts.items())}
                STATE.counts = {}
                log(f"held-out expert load fractions per MoE layer: {ev['expert_load_fraction']}")
            log(f"held-out {name} (transformers f32, index_topk {c.index_topk}): nll {nll:.4f}, "
                f"ppl {math.exp(nll):.3f}")
        ev["unigram"] = {"mean_nll": uni_nll, "perplexity": math.exp(uni_nll)}
        ev["windows"] = n_win
        ev["targets"] = int(targets.size)
        ev["ratio_unigram_over_sparse"] = ev["unigram"]["perplexity"] / ev["sparse"]["perplexity"]
        ev["ratio_unigram_over_dense"] = ev["unigram"]["perplexity"] / ev["dense"]["perplexity"]
        ev["sparse_vs_dense_rel"] = (ev["sparse"]["perplexity"] - ev["dense"]["perplexity"]) / \
            ev["dense"]["perplexity"]
        ev["meets_third_of_unigram"] = bool(min(ev["ratio_unigram_over_sparse"],
                                                ev["ratio_unigram_over_dense"]) >= 3.0)
        ev["meets_sparse_dense_5pct"] = bool(abs(ev["sparse_vs_dense_rel"]) <= 0.05)
        log(f"ratios: unigram/sparse {ev['ratio_unigram_over_sparse']:.2f}, unigram/dense "
            f"{ev['ratio_unigram_over_dense']:.2f}, (sparse-dense)/dense "
            f"{100 * ev['sparse_vs_dense_rel']:.2f}%")
        if not ev["meets_third_of_unigram"]:
            warn("held-out perplexity is not at most a third of the unigram perplexity")
        if not ev["meets_sparse_dense_5pct"]:
            warn("sparse and dense perplexity differ by more than 5%")

        # indexer quality: share of the dense attention mass that the top-k keys capture
        try:
            m = models_f32["sparse"]
            patch(m)
            STATE.mode, STATE.probe = "probe", []
            with torch.no_grad():
                for i in range(0, min(n_win, 32), 16):
                    m(input_ids=held_windows_t[i:i + 16], use_cache=False)
            nl = len(m.model.layers)
            per_layer = [float(np.mean(STATE.probe[j::nl])) for j in range(nl)]
            ev["topk_attention_mass"] = per_layer
            log(f"dense attention mass inside the top-{cfg.index_topk} keys (queries t >= "
                f"{cfg.index_topk}), per layer: {[round(v, 4) for v in per_layer]}")
            unpatch(m)
            STATE.mode = "hf"
        except Exception as e:  # diagnostics only
            warn(f"probe failed: {e!r}")
            unpatch(models_f32["sparse"])
            STATE.mode = "hf"
        metrics["eval"] = ev

        # ---- oracle sequence (CPU float32, transformers' forward, DSA active)
        name, text, ids = pick_oracle(tok, held_docs, held_names, args.ctx, args.oracle_doc)
        log(f"oracle sequence: {len(ids)} tokens from {name}, {len(text)} chars")
        hf_ids = None
        try:
            hf_tok = transformers.AutoTokenizer.from_pretrained(mdir)
            hf_ids = hf_tok(text)["input_ids"]
            metrics["hf_tokenizer_class"] = type(hf_tok).__name__
            if hf_ids != ids:
                warn(f"AutoTokenizer ids differ from tokenizers' ids "
                     f"({len(hf_ids)} vs {len(ids)})")
            rt = hf_tok.decode(ids, skip_special_tokens=True)
            if rt != text:
                warn("AutoTokenizer decode does not round-trip the oracle text")
        except Exception as e:
            warn(f"AutoTokenizer check failed: {e!r}")
        cpu_model = transformers.DeepseekV32ForCausalLM.from_pretrained(
            mdir, dtype=torch.float32, attn_implementation="eager",
            experts_implementation="eager").eval()
        with torch.no_grad():
            x = torch.tensor([ids], dtype=torch.long)
            def seq_nll(mm, xx):
                return lm_nll(mm(input_ids=xx, use_cache=False).logits, xx).double().mean().item()

            nll_cpu = seq_nll(cpu_model, x)
            nll_gpu = seq_nll(models_f32["sparse"], x.to(dev))
            nll_dense = seq_nll(models_f32["dense"], x.to(dev))
        log(f"oracle mean NLL (f32, DSA): cpu {nll_cpu:.6f}, gpu {nll_gpu:.6f}; "
            f"dense {nll_dense:.6f}")
        oracle = {
            "tokens": ids,
            "mean_nll_f32": nll_cpu,
            "perplexity_f32": math.exp(nll_cpu),
            "text": text,
            "source_document": name,
            "n_tokens": len(ids),
            "definition": "tokens = tokenizer(text)['input_ids'] (BOS first); mean_nll_f32 = mean "
                          "over positions t = 1..n-1 of -log softmax(logits[t-1])[tokens[t]] "
                          f"(natural log), transformers {transformers.__version__} "
                          "DeepseekV32ForCausalLM float32 on the "
                          "CPU, eager attention, models/demo weights (BF16) as saved, "
                          "DSA index_topk "
                          f"{cfg.index_topk} active",
            "mean_nll_f32_gpu": nll_gpu,
            "mean_nll_f32_dense": nll_dense,
        }
        with open(os.path.join(stage, "tests", "data", "demo_heldout.json"), "w",
                  encoding="utf-8") as f:
            json.dump(oracle, f, ensure_ascii=False, indent=1)
            f.write("\n")
        metrics["oracle"] = {k: v for k, v in oracle.items() if k not in ("tokens", "text")}

        # ---- samples (transformers' forward without cache, DSA active)
        samples = []
        try:
            m = models_f32["sparse"]
            g = torch.Generator(device=dev)
            g.manual_seed(args.seed)
            for prompt, temp in (("The json module", 0.0), ("The json module", 0.8),
                                 ("To read a file line by line,", 0.8), (">>> import ", 0.8)):
                cur = tok.encode(prompt).ids
                for _ in range(80):
                    with torch.no_grad():
                        xx = torch.tensor([cur], device=dev)
                        lg = m(input_ids=xx, use_cache=False).logits[0, -1].float()
                    if temp == 0.0:
                        nxt = int(lg.argmax())
                    else:
                        nxt = int(torch.multinomial(F.softmax(lg / temp, -1), 1, generator=g))
                    cur.append(nxt)
                    if nxt == EOS_ID:
                        break
                samples.append({"prompt": prompt, "temperature": temp,
                                "text": tok.decode(cur, skip_special_tokens=True)})
                log(f"sample (T={temp}): {samples[-1]['text']!r}")
        except Exception as e:
            warn(f"sampling failed: {e!r}")
        metrics["samples"] = samples

    except Exception:
        import traceback
        traceback.print_exc()
        warn("post-training stage failed: " + traceback.format_exc().strip().splitlines()[-1])
        ev = metrics.get("eval", {})

    # ---- metrics, curve, plot, tarball
    metrics["curve"] = curve
    metrics["total_seconds"] = time.time() - T0
    with open(os.path.join(mdir, "training_metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=1, ensure_ascii=False)
        f.write("\n")
    try:
        plot_curve(curve, ev, os.path.join(mdir, "loss.png"))
    except Exception as e:
        log(f"no plot: {e!r}")
    if args.tar:
        with tarfile.open(args.tar, "w:gz") as tf:
            for root, _, files in os.walk(stage):
                for fn in sorted(files):
                    p = os.path.join(root, fn)
                    tf.add(p, arcname=os.path.relpath(p, stage))
        log(f"packed {args.tar} ({os.path.getsize(args.tar) / 1e6:.2f} MB)")
    log(f"done in {time.time() - T0:.1f}s; warnings: {metrics['warnings']}")


# --------------------------------------------------------------------------------- pieces


def pick_oracle(tok, docs, names, ctx, preferred):
    """A held-out text whose tokenizer(text) is exactly ctx ids (BOS first) and whose ids are
    the tokens of that text inside its document (the cut falls on a token boundary)."""
    order = sorted(range(len(docs)), key=lambda i: (names[i] != preferred, i))
    for i in order:
        doc = docs[i]
        starts = [0] + [m.end() for m in re.finditer(r"\n\n", doc)]
        for s in starts[:200]:
            body = doc[s:]
            enc = tok.encode(body, add_special_tokens=False)
            if len(enc.ids) < ctx:
                break
            end = enc.offsets[ctx - 2][1]
            text = body[:end]
            ids = tok.encode(text).ids
            if ids == [BOS_ID] + enc.ids[: ctx - 1] and text == text.strip():
                return names[i], text, ids
    raise RuntimeError("no held-out text of the right length")


def fix_expert_layout(path, cfg, warn):
    """Make sure experts are stored one tensor per expert and projection (HF / DeepSeek
    release layout); rewrite fused `experts.gate_up_proj` / `experts.down_proj` if present."""
    from safetensors.torch import load_file, save_file
    sd = load_file(path)
    fused = [k for k in sd if k.endswith("mlp.experts.gate_up_proj") or
             k.endswith("mlp.experts.down_proj")]
    if not fused:
        return
    warn(f"save_pretrained wrote fused expert tensors ({len(fused)}); rewriting per expert")
    out = {}
    I = cfg.moe_intermediate_size
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            base = k[: -len("gate_up_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.gate_proj.weight"] = v[e, :I].contiguous()
                out[f"{base}{e}.up_proj.weight"] = v[e, I:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            base = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    save_file(out, path, metadata={"format": "pt"})


def describe_safetensors(path):
    from safetensors import safe_open
    dtypes = {}
    names, f32 = [], []
    with safe_open(path, framework="pt") as f:
        for k in f.keys():
            dt = str(f.get_slice(k).get_dtype())
            dtypes[dt] = dtypes.get(dt, 0) + 1
            names.append(k)
            if dt.upper() in ("F32", "FLOAT32", "TORCH.FLOAT32"):
                f32.append(k)
    log(f"safetensors: {len(names)} tensors, dtypes {dtypes}; e.g. "
        f"{[n for n in names if '.experts.0.' in n][:3]}")
    return {"count": len(names), "dtypes": dtypes, "f32_tensors": f32}


def plot_curve(curve, ev, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    off = 0
    for ph, color in ((1, "tab:blue"), (3, "tab:red")):
        pts = [(c["step"], c["loss"]) for c in curve if c["phase"] == ph and "loss" in c]
        if ph == 3:
            off = max([c["step"] for c in curve if c["phase"] == 1] + [0])
        if pts:
            ax[0].plot([s + off for s, _ in pts], [v for _, v in pts], color=color,
                       label="phase 1 (dense)" if ph == 1 else "phase 3 (DSA)")
    hp = [(c["step"], c["heldout_loss_dense"]) for c in curve if "heldout_loss_dense" in c]
    if hp:
        ax[0].plot([s for s, _ in hp], [v for _, v in hp], "o--", color="black",
                   label="held-out (dense)")
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("LM loss (nats/token)")
    ax[0].set_ylim(top=min(8.0, ax[0].get_ylim()[1]))
    ax[0].legend()
    ax[0].grid(alpha=0.3)
    kp = [(c["step"], c["kl"]) for c in curve if c["phase"] == 2]
    ax[1].plot([s for s, _ in kp], [v for _, v in kp], color="tab:green")
    ax[1].set_xlabel("phase 2 step")
    ax[1].set_ylabel("indexer KL (sum over layers)")
    ax[1].grid(alpha=0.3)
    fig.suptitle("demo model training (held-out ppl: dense %.2f, DSA %.2f, unigram %.1f)" % (
        ev["dense"]["perplexity"], ev["sparse"]["perplexity"], ev["unigram"]["perplexity"]))
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
