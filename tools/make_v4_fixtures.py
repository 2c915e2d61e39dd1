#!/usr/bin/env python3
"""Generate Strata's DeepSeek-V4 oracle fixtures (tests/data/models/deepseek_v4*/).

Builds tiny random-weight DeepSeek-V4 models with transformers' own classes
(DeepseekV4Config, DeepseekV4ForCausalLM), saves them with save_pretrained and writes
reference outputs computed by transformers, in float32 on the CPU with eager attention:

  reference.json          model_type, seed, tokens, greedy_prompt, greedy_f32, max_abs_logit_f32,
                          min_top2_margin, decode-vs-forward differences, layer kinds, rope
                          frequencies, probes of version-dependent behaviour, notes
  reference.safetensors   logits_f32 [T, vocab]: one teacher-forced forward over `tokens`

Every top-k of the modeling module (router and lightning indexer) is replaced by a stable
one (equal scores -> lower position first); the patch counts its hits from the modeling
module and the script fails when a fixture did not go through it. Tokens are drawn per seed
and then repaired position by position until no decision the engine must reproduce is a
near tie (top-2 logit margin, learned router choice, indexer top-k boundary; an exact
indexer tie is allowed when every tied row scores exactly 0 with all head products clearly
negative, because the stable rule then decides it). Incremental decode through the model's
own cache must reproduce the one-shot forward at every position.

The math is described in docs/deepseek-v4.md; how to run this is in tools/README.md.

Usage: python3 tools/make_v4_fixtures.py [--out tests/data/models] [--only NAME ...] [--list]
"""

import argparse
import copy
import dataclasses
import inspect
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F

import transformers
from safetensors.torch import load_file, save_file

MARGIN_REL = 1e-3       # reject when a top-2 logit margin < MARGIN_REL * max|logit|
ROUTER_GAP_ABS = 2e-5   # reject when a learned router choice is decided by less (sqrtsoftplus scores)
DSA_GAP_REL = 2e-5      # reject when the indexer's k-th and (k+1)-th scores differ by less (relative)
ZERO_TIE_COS = 1e-4     # an exact 0-score tie needs every head product <= -ZERO_TIE_COS*|q||k|
DECODE_TOL_REL = 1e-5   # incremental decode vs one-shot forward, times max|logit| (fail above)
MAX_SEEDS = 20
MAX_REPAIRS = 300
GREEDY_STEPS = 16
FP8_MAX = 448.0
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

# Config fields of DeepseekV4Config this script sets or reads.
REQUIRED_CONFIG_FIELDS = [
    "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "q_lora_rank", "num_experts_per_tok", "n_routed_experts",
    "n_shared_experts", "scoring_func", "routed_scaling_factor", "max_position_embeddings", "rope_theta",
    "layer_types", "compress_rates", "compress_rope_theta", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
    "mlp_layer_types", "swiglu_limit", "sliding_window", "o_groups", "o_lora_rank", "index_n_heads",
    "index_head_dim", "index_topk", "num_nextn_predict_layers", "rms_norm_eps", "rope_parameters",
    "partial_rotary_factor",
]
REQUIRED_CLASSES = [
    "DeepseekV4Attention", "DeepseekV4HCACompressor", "DeepseekV4CSACompressor", "DeepseekV4Indexer",
    "DeepseekV4TopKRouter", "DeepseekV4HashRouter", "DeepseekV4HyperConnection", "DeepseekV4HyperHead",
    "DeepseekV4Experts", "DeepseekV4MLP", "DeepseekV4RotaryEmbedding", "DeepseekV4SparseMoeBlock",
]
OPTIONAL_CLASSES = ["DeepseekV4IndexerScorer", "DeepseekV4HCACache", "DeepseekV4CSACache", "DeepseekV4GroupedLinear"]
ATTN_ATTRS = ["q_a_proj", "q_a_norm", "q_b_proj", "q_b_norm", "kv_proj", "kv_norm", "o_a_proj", "o_b_proj",
              "sinks", "compressor", "scaling"]


def yarn(factor, orig):
    return {"rope_type": "yarn", "factor": float(factor), "original_max_position_embeddings": int(orig),
            "beta_fast": 32.0, "beta_slow": 1.0}


def common(**kw):
    base = dict(num_key_value_heads=1, n_shared_experts=1, scoring_func="sqrtsoftplus", hidden_act="silu",
                rope_theta=10000.0, compress_rope_theta=160000.0, num_nextn_predict_layers=1,
                bos_token_id=0, eos_token_id=1, pad_token_id=None, tie_word_embeddings=False)
    base.update(kw)
    return base


# T: tokens; prompt: greedy prompt length (generation then crosses compressed-block boundaries);
# chunks: chunk sizes of the chunked-prefill check; layout "deepseek" rewrites config.json into
# DeepSeek's own layout (compress_ratios, num_hash_layers, rope_scaling, qk_rope_head_dim) and the
# reload must reproduce the logits; quant writes FP8/FP4 weights like the released checkpoints.
FIXTURES = [
    dict(name="deepseek_v4", T=96, prompt=72, chunks=[13, 1, 6, 1, 1, 9], layout="transformers",
         cfg=common(vocab_size=256, hidden_size=64, num_hidden_layers=5, num_attention_heads=4, head_dim=64,
                    q_lora_rank=32, o_groups=2, o_lora_rank=16, n_routed_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=32, routed_scaling_factor=1.5, swiglu_limit=2.5,
                    layer_types=[SWA, CSA, HCA, CSA, HCA], mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
                    compress_rates={CSA: 4, HCA: 16}, sliding_window=8, index_n_heads=4, index_head_dim=32,
                    index_topk=4, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
                    rope_parameters=yarn(16, 32), max_position_embeddings=512)),
    dict(name="deepseek_v4_b", T=320, prompt=250, chunks=[130, 1, 1, 126, 1, 5], layout="deepseek",
         cfg=common(vocab_size=272, hidden_size=56, num_hidden_layers=4, num_attention_heads=2, head_dim=32,
                    partial_rotary_factor=0.25, q_lora_rank=24, o_groups=1, o_lora_rank=24, n_routed_experts=6,
                    num_experts_per_tok=3, moe_intermediate_size=24, routed_scaling_factor=2.5, swiglu_limit=1.0,
                    layer_types=[HCA, CSA, SWA, CSA], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
                    compress_rates={CSA: 4, HCA: 128}, sliding_window=16, index_n_heads=2, index_head_dim=16,
                    index_topk=16, hc_mult=2, hc_sinkhorn_iters=7, hc_eps=1e-5, rms_norm_eps=1e-5,
                    compress_rope_theta=40000.0, rope_parameters=yarn(16, 64), max_position_embeddings=1024,
                    eos_token_id=[1, 2])),
    dict(name="deepseek_v4_fp8_fp4", T=64, prompt=40, chunks=[21, 1, 3], layout="transformers", quant=True,
         cfg=common(vocab_size=192, hidden_size=192, num_hidden_layers=3, num_attention_heads=2, head_dim=128,
                    q_lora_rank=160, o_groups=2, o_lora_rank=96, n_routed_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=64, routed_scaling_factor=1.5, swiglu_limit=3.0,
                    layer_types=[CSA, HCA, SWA], mlp_layer_types=["hash_moe", "moe", "moe"],
                    compress_rates={CSA: 4, HCA: 16}, sliding_window=8, index_n_heads=4, index_head_dim=64,
                    index_topk=4, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
                    rope_parameters=yarn(16, 32), max_position_embeddings=512)),
]

LOG = []


def log(*args):
    msg = " ".join(str(a) for a in args)
    print(msg, flush=True)
    LOG.append(msg)


def die(msg):
    raise RuntimeError(msg)


# --------------------------------------------------------------------------- the modeling module


def v4_module():
    try:
        import transformers.models.deepseek_v4.modeling_deepseek_v4 as mod
    except Exception as e:  # noqa: BLE001 - report any import failure the same way
        die(f"transformers {transformers.__version__} has no importable deepseek_v4 modeling module: {e}")
    missing = [c for c in REQUIRED_CLASSES if not hasattr(mod, c)]
    if missing:
        die(f"modeling_deepseek_v4 lacks {missing}; this script was written against transformers 5.17")
    for c in ("DeepseekV4Config", "DeepseekV4ForCausalLM"):
        if not hasattr(transformers, c):
            die(f"transformers does not export {c}")
    return mod


MOD = None
MOD_FILES = set()


def set_module(mod):
    global MOD
    MOD = mod
    MOD_FILES.update({mod.__file__, os.path.realpath(mod.__file__)})


# --------------------------------------------------------------------------- stable top-k and monitors


class State:
    def __init__(self):
        self.monitor = False
        self.hits = {}
        self.reset(0)

    def reset(self, seq):
        self.seq = seq
        self.router_gap = np.full(seq, np.inf)
        self.dsa_gap = np.full(seq, np.inf)
        self.dsa_tie_bad = np.zeros(seq, dtype=bool)
        self.dsa_ties = 0
        self.dsa_rows_selecting = 0


STATE = State()


def _stable_topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):  # noqa: A002 - torch's names
    """torch.topk with a defined tie order: equal values -> lower index first; always sorted."""
    if out is not None:
        die("stable top-k: out= is not supported")
    if dim is None:
        dim = -1
    frame = sys._getframe(1)
    if frame.f_code.co_filename in MOD_FILES:
        me = frame.f_locals.get("self")
        owner = type(me).__name__ if me is not None else frame.f_code.co_name
        STATE.hits[owner] = STATE.hits.get(owner, 0) + 1
        if STATE.monitor and "Indexer" in owner:
            indexer_monitor(input, int(k), frame.f_locals)
    vals, idx = torch.sort(input, dim=dim, descending=bool(largest), stable=True)
    return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))


def install_stable_topk():
    torch.topk = _stable_topk
    torch.Tensor.topk = _stable_topk
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]])
    assert torch.topk(x, 2).indices.tolist() == [[1, 2]] and x.topk(2).indices.tolist() == [[1, 2]]
    assert torch.topk(-x, 2, largest=False).indices.tolist() == [[1, 2]]


def indexer_monitor(scores, k, loc):
    """Boundary analysis of one indexer top-k call (one-shot forward, batch 1)."""
    if scores.dim() != 3 or scores.shape[0] != 1 or scores.shape[1] != STATE.seq or k == 0:
        return
    q, ck = loc.get("q"), loc.get("compressed_kv")
    if q is None or ck is None:
        die("indexer top-k caller has no local `q` / `compressed_kv`; update indexer_monitor for this version")
    q = q.detach().float()[0]
    ck = ck.detach().float().reshape(-1, ck.shape[-1])
    if q.shape[0] != STATE.seq:
        q = q.transpose(0, 1)
    assert q.shape[0] == STATE.seq and q.shape[-1] == ck.shape[-1], (tuple(q.shape), tuple(ck.shape))
    sc = scores.detach().float()[0]
    for s in range(sc.shape[0]):
        row = sc[s]
        fin = torch.isfinite(row)
        if int(fin.sum()) <= k:
            continue  # every existing compressed row is selected
        STATE.dsa_rows_selecting += 1
        vals = torch.sort(row[fin], descending=True).values
        a, b = float(vals[k - 1]), float(vals[k])
        if a == b:
            STATE.dsa_ties += 1
            if a != 0.0:
                STATE.dsa_tie_bad[s] = True
                continue
            tied = torch.nonzero(fin & (row == 0.0)).flatten()
            dots = q[s] @ ck[tied].T
            bound = ZERO_TIE_COS * q[s].norm(dim=-1)[:, None] * ck[tied].norm(dim=-1)[None, :]
            if bool((dots > -bound).any()):
                STATE.dsa_tie_bad[s] = True
        else:
            scale = float(vals.abs().max())
            STATE.dsa_gap[s] = min(STATE.dsa_gap[s], (a - b) / scale if scale > 0 else math.inf)


def router_hook(module, args, output):
    if not STATE.monitor:
        return
    if not (isinstance(output, tuple) and len(output) == 3):
        die(f"{type(module).__name__} returned {type(output)}; expected (logits, weights, indices)")
    logits = output[0].detach()
    if logits.shape[0] != STATE.seq:
        return
    b = module.score_fn(logits) + module.e_score_correction_bias
    srt = torch.sort(b, dim=-1, descending=True).values
    k = module.top_k
    if k < srt.shape[-1]:
        gap = (srt[:, k - 1] - srt[:, k]).double().numpy()
        STATE.router_gap = np.minimum(STATE.router_gap, gap)


def instrument(model):
    for m in model.modules():
        if type(m).__name__ == "DeepseekV4TopKRouter" and not getattr(m, "_v4_hooked", False):
            for a in ("score_fn", "e_score_correction_bias", "top_k"):
                if not hasattr(m, a):
                    die(f"DeepseekV4TopKRouter has no `{a}`")
            m.register_forward_hook(router_hook)
            m._v4_hooked = True


# --------------------------------------------------------------------------- config and model


def config_fields(cls):
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(inspect.signature(cls.__init__).parameters)


def build_config(fx):
    cls = transformers.DeepseekV4Config
    fields = config_fields(cls)
    missing = [f for f in REQUIRED_CONFIG_FIELDS if f not in fields]
    if missing:
        die(f"DeepseekV4Config has no fields {missing}")
    kw = copy.deepcopy(fx["cfg"])
    kw["attn_implementation"] = "eager"
    kw["experts_implementation"] = "eager"
    try:
        cfg = cls(**kw)
    except Exception as e:  # noqa: BLE001
        die(f"{fx['name']}: DeepseekV4Config(**{sorted(kw)}) failed: {e}")
    cfg._attn_implementation = "eager"
    want = fx["cfg"]
    checks = {
        "layer_types": want["layer_types"], "mlp_layer_types": want["mlp_layer_types"],
        "compress_rates": want["compress_rates"], "sliding_window": want["sliding_window"],
        "qk_rope_head_dim": int(want["head_dim"] * want.get("partial_rotary_factor", 64 / 512)),
    }
    for k, v in checks.items():
        got = getattr(cfg, k, None)
        if (list(got) if isinstance(v, list) else got) != v:
            die(f"{fx['name']}: config.{k} is {got!r}, expected {v!r}")
    rp = cfg.rope_parameters
    if not (isinstance(rp, dict) and isinstance(rp.get("main"), dict) and isinstance(rp.get("compress"), dict)):
        die(f"{fx['name']}: rope_parameters is not nested main/compress: {rp!r}")
    return cfg


def check_structure(model, cfg):
    m = model.model
    for a in ("embed_tokens", "layers", "norm", "rotary_emb", "hc_head"):
        if not hasattr(m, a):
            die(f"DeepseekV4Model has no `{a}`")
    for i, layer in enumerate(m.layers):
        for a in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm", "attn_hc", "ffn_hc"):
            if not hasattr(layer, a):
                die(f"layer {i} has no `{a}`")
        attn = layer.self_attn
        for a in ATTN_ATTRS:
            if not hasattr(attn, a):
                die(f"layer {i} attention has no `{a}`")
        lt, comp = cfg.layer_types[i], attn.compressor
        want = {SWA: None, CSA: "DeepseekV4CSACompressor", HCA: "DeepseekV4HCACompressor"}[lt]
        if (comp is None and want is not None) or (comp is not None and type(comp).__name__ != want):
            die(f"layer {i} ({lt}) has compressor {type(comp).__name__}")
        if lt == CSA and type(getattr(comp, "indexer", None)).__name__ != "DeepseekV4Indexer":
            die(f"layer {i}: CSA compressor has no DeepseekV4Indexer")
        gate = type(layer.mlp.gate).__name__
        want_gate = "DeepseekV4HashRouter" if cfg.mlp_layer_types[i] == "hash_moe" else "DeepseekV4TopKRouter"
        if gate != want_gate:
            die(f"layer {i}: router is {gate}, expected {want_gate}")
    rot = m.rotary_emb
    for a in ("main_inv_freq", "compress_inv_freq", "main_attention_scaling", "compress_attention_scaling"):
        if not hasattr(rot, a):
            die(f"DeepseekV4RotaryEmbedding has no `{a}`")


GAINS = {"lm_head": 2.0, "experts": 1.5, "shared_experts": 1.5}


def randomise(model, cfg, seed):
    g = torch.Generator().manual_seed(seed)

    def normal(shape, std):
        return torch.randn(tuple(shape), generator=g, dtype=torch.float32) * std

    def uniform(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(tuple(shape), generator=g, dtype=torch.float32)

    n_bias = n_table = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            parts = name.split(".")
            leaf = parts[-1]
            if name.endswith("embed_tokens.weight"):
                v = normal(p.shape, 1.0)
            elif name.endswith("lm_head.weight"):
                v = normal(p.shape, GAINS["lm_head"] / math.sqrt(p.shape[1]))
            elif leaf == "e_score_correction_bias":  # a buffer in the versions read; accept a parameter
                v = uniform(p.shape, -0.1, 0.1)
                n_bias += 1
            elif leaf == "sinks":
                v = normal(p.shape, 1.0)
            elif leaf == "position_bias":
                v = normal(p.shape, 0.5)
            elif leaf in ("fn", "hc_fn"):
                v = normal(p.shape, 1.0 / math.sqrt(p.shape[1]))
            elif leaf in ("base", "hc_base"):
                v = normal(p.shape, 0.5)
            elif leaf in ("scale", "hc_scale"):
                v = uniform(p.shape, 0.5, 1.5)
            elif p.ndim == 1 and "norm" in name:
                v = uniform(p.shape, 0.6, 1.4)
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                v = normal(p.shape, GAINS["experts"] / math.sqrt(p.shape[2]))
            elif name.endswith("mlp.gate.weight"):
                v = normal(p.shape, 1.0 / math.sqrt(p.shape[1]))
            elif p.ndim == 2:
                gain = GAINS["shared_experts"] if ".shared_experts." in name else 1.0
                v = normal(p.shape, gain / math.sqrt(p.shape[1]))
            else:
                die(f"no randomisation rule for parameter {name} {tuple(p.shape)}")
            p.copy_(v)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(uniform(b.shape, -0.1, 0.1))
                n_bias += 1
            elif name.endswith("tid2eid"):
                rows = [torch.randperm(cfg.n_routed_experts, generator=g)[: b.shape[1]] for _ in range(b.shape[0])]
                b.copy_(torch.stack(rows).to(b.dtype))
                n_table += 1
    n_hash = sum(t == "hash_moe" for t in cfg.mlp_layer_types)
    if n_table != n_hash or n_bias != len(cfg.mlp_layer_types) - n_hash:
        die(f"randomised {n_table} tid2eid tables / {n_bias} router biases; expected {n_hash} / "
            f"{len(cfg.mlp_layer_types) - n_hash}")


def load_model(path):
    model, info = transformers.DeepseekV4ForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        die(f"loading {path}: {bad}")
    model.eval()
    instrument(model)
    return model


# --------------------------------------------------------------------------- forwards


@torch.no_grad()
def forward_logits(model, ids):
    return model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].detach()


@torch.no_grad()
def chunked_logits(model, ids, sizes):
    """Feeds `ids` through the model's own cache in chunks of `sizes` (then one at a time)."""
    out, cache, pos = [], None, 0
    sizes = list(sizes)
    while pos < len(ids):
        n = min(sizes.pop(0) if sizes else 1, len(ids) - pos)
        o = model(input_ids=torch.tensor([ids[pos:pos + n]]), past_key_values=cache, use_cache=True,
                  position_ids=torch.arange(pos, pos + n).unsqueeze(0))
        cache = o.past_key_values
        out.append(o.logits[0].detach())
        pos += n
    return torch.cat(out), [type(layer).__name__ for layer in getattr(cache, "layers", [])]


def margins(logits):
    t = logits.double().topk(2, dim=-1)
    return (t.values[:, 0] - t.values[:, 1]).numpy(), t.indices[:, 0].numpy()


def checked_forward(model, ids):
    STATE.reset(len(ids))
    STATE.monitor = True
    try:
        lg = forward_logits(model, ids)
    finally:
        STATE.monitor = False
    return lg, STATE.router_gap.copy(), STATE.dsa_gap.copy(), STATE.dsa_tie_bad.copy(), STATE.dsa_ties, \
        STATE.dsa_rows_selecting


def first_bad(marg, rgap, dgap, tbad, thr, start=0):
    for p in range(start, len(marg)):
        if marg[p] < thr:
            return p, f"top-2 margin {marg[p]:.3g} < {thr:.3g}"
        if rgap[p] < ROUTER_GAP_ABS:
            return p, f"router gap {rgap[p]:.3g}"
        if dgap[p] < DSA_GAP_REL:
            return p, f"indexer boundary gap {dgap[p]:.3g}"
        if tbad[p]:
            return p, "indexer tie not robust"
    return None


def greedy_checked(model, prompt, thr):
    ids, out, mins = list(prompt), [], math.inf
    for _ in range(GREEDY_STEPS):
        lg, rgap, dgap, tbad, _, _ = checked_forward(model, ids)
        m, am = margins(lg[-1:])
        mins = min(mins, float(m[0]))
        if m[0] < thr:
            return None, f"greedy step {len(out)} margin {m[0]:.3g}", mins
        bad = first_bad(np.full(len(ids), np.inf), rgap, dgap, tbad, thr, start=len(prompt))
        if bad is not None:
            return None, f"greedy position {bad[0]}: {bad[1]}", mins
        out.append(int(am[0]))
        ids.append(int(am[0]))
    return out, None, mins


def choose_tokens(model, fx, vocab, seed):
    """Random tokens, repaired until every decision is clear. Returns (tokens, stats) or None."""
    rng = np.random.default_rng(seed)
    T, P = fx["T"], fx["prompt"]
    tokens = [int(t) for t in rng.integers(0, vocab, size=T)]
    repairs = 0
    for _ in range(MAX_REPAIRS):
        lg, rgap, dgap, tbad, ties, selecting = checked_forward(model, tokens)
        marg, _ = margins(lg)
        thr = MARGIN_REL * float(lg.abs().max())
        bad = first_bad(marg, rgap, dgap, tbad, thr)
        if bad is None:
            greedy, why, gmin = greedy_checked(model, tokens[:P], thr)
            if greedy is not None:
                return tokens, dict(logits=lg, greedy=greedy, repairs=repairs, thr=thr,
                                    min_margin=min(float(marg.min()), gmin), router_gap=float(rgap.min()),
                                    dsa_gap=float(dgap.min()), dsa_ties=ties, dsa_rows_selecting=selecting)
            bad = (P - 1, why)
        pos, why = bad
        old = tokens[pos]
        while tokens[pos] == old:
            tokens[pos] = int(rng.integers(0, vocab))
        repairs += 1
    log(f"  {fx['name']}: seed {seed}: no clean token sequence after {MAX_REPAIRS} repairs")
    return None


# --------------------------------------------------------------------------- probes


def probe_shared_clamp(model, cfg):
    """Does the shared expert clamp its SwiGLU like the routed experts? (varies between versions)"""
    mlp = model.model.layers[0].mlp.shared_experts
    lim = float(cfg.swiglu_limit)
    x = torch.randn(1, 8, cfg.hidden_size, generator=torch.Generator().manual_seed(7)) * 20
    with torch.no_grad():
        y = mlp(x)
        g, u = mlp.gate_proj(x), mlp.up_proj(x)
        clamped = mlp.down_proj(F.silu(g.clamp(max=lim)) * u.clamp(-lim, lim))
        plain = mlp.down_proj(F.silu(g) * u)
    if torch.allclose(y, clamped, rtol=1e-5, atol=1e-5) and not torch.allclose(y, plain, rtol=1e-5, atol=1e-5):
        return True
    if torch.allclose(y, plain, rtol=1e-5, atol=1e-5):
        return False
    die("shared expert output matches neither the clamped nor the plain SwiGLU")


def describe(model):
    cfg = model.config
    rot = model.model.rotary_emb
    kinds = []
    for i, layer in enumerate(model.model.layers):
        lt = cfg.layer_types[i]
        kinds.append(dict(layer=i, attention=lt, compress_rate=cfg.compress_rates.get(lt, 0),
                          mlp=cfg.mlp_layer_types[i], rope="main" if lt == SWA else "compress"))
    rope = {t: dict(params=dict(cfg.rope_parameters[t]),
                    inv_freq=[float(v) for v in getattr(rot, f"{t}_inv_freq").tolist()],
                    attention_scaling=float(getattr(rot, f"{t}_attention_scaling"))) for t in ("main", "compress")}
    csa = [layer.self_attn.compressor.indexer for layer in model.model.layers
           if cfg.layer_types[layer.self_attn.layer_idx] == CSA]
    return dict(layers=kinds, rope=rope, softmax_scale=float(model.model.layers[0].self_attn.scaling),
                qk_rope_head_dim=int(cfg.qk_rope_head_dim),
                indexer_has_scorer_submodule=bool(csa) and hasattr(csa[0], "scorer"),
                shared_expert_swiglu_clamp=probe_shared_clamp(model, cfg))


# --------------------------------------------------------------------------- DeepSeek layout and quantisation


def to_deepseek_layout(path, fx):
    """Rewrites config.json the way DeepSeek ships it; the reload must give the same logits."""
    with open(path) as f:
        c = json.load(f)
    ratio = {SWA: 0, CSA: c["compress_rates"][CSA], HCA: c["compress_rates"][HCA]}
    if (ratio[CSA], ratio[HCA]) != (4, 128):
        die("the DeepSeek layout can only express compress rates 4 and 128")
    mlp = c.pop("mlp_layer_types")
    n_hash = mlp.count("hash_moe")
    if mlp != ["hash_moe"] * n_hash + ["moe"] * (len(mlp) - n_hash):
        die("num_hash_layers can only express a hash_moe prefix")
    rp = c.pop("rope_parameters")
    comp = dict(rp["compress"])
    c["compress_ratios"] = [ratio[t] for t in c.pop("layer_types")] + [0] * int(c["num_nextn_predict_layers"])
    c["num_hash_layers"] = n_hash
    c["qk_rope_head_dim"] = int(c["head_dim"] * c.pop("partial_rotary_factor"))
    c["rope_theta"] = rp["main"]["rope_theta"]
    c["compress_rope_theta"] = comp["rope_theta"]
    c["rope_scaling"] = {"type": comp["rope_type"], "factor": comp["factor"], "beta_fast": comp["beta_fast"],
                         "beta_slow": comp["beta_slow"],
                         "original_max_position_embeddings": comp["original_max_position_embeddings"]}
    c.pop("compress_rates")
    c["topk_method"] = "noaux_tc"
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")


def e8m0_exponent(amax, qmax):
    """Smallest e with amax <= qmax * 2**e (power-of-two scales, as DeepSeek's ue8m0)."""
    e = np.zeros(amax.shape, dtype=np.int64)
    pos = amax > 0
    m, ex = np.frexp(amax[pos].astype(np.float64) / qmax)
    e[pos] = np.where(m == 0.5, ex - 1, ex)
    if e.size and not (e.min() >= -127 and e.max() <= 127):
        die(f"block scale exponent out of the E8M0 range: {e.min()}..{e.max()}")
    return e


def quant_fp8_blocks(w):
    """F8_E4M3 codes [out,in] + F8_E8M0 block scales [ceil(out/128), ceil(in/128)] + dequantised f32."""
    w = w.float().contiguous()
    o, i = w.shape
    bo, bi = -(-o // 128), -(-i // 128)
    pad = torch.zeros(bo * 128, bi * 128)
    pad[:o, :i] = w
    amax = pad.view(bo, 128, bi, 128).abs().amax(dim=(1, 3)).numpy()
    e = e8m0_exponent(amax, FP8_MAX)
    s = torch.from_numpy(np.ldexp(1.0, e.astype(np.int32)).astype(np.float32))
    full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:o, :i]
    codes = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, (e + 127).astype(np.uint8), dequant_fp8_blocks(codes, (e + 127).astype(np.uint8))


def dequant_fp8_blocks(codes, scale_u8):
    o, i = codes.shape
    s = torch.from_numpy(np.ldexp(1.0, scale_u8.astype(np.int32) - 127).astype(np.float32))
    return codes.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:o, :i]


def quant_fp4_rows(w):
    """Packed E2M1 (I8 [out, in/2], low nibble = even column) + F8_E8M0 scales [out, in/32]."""
    w = w.float().numpy().astype(np.float64)
    o, i = w.shape
    if i % 32:
        die(f"FP4 weight with {i} input columns (needs a multiple of 32)")
    blocks = w.reshape(o, i // 32, 32)
    e = e8m0_exponent(np.abs(blocks).max(axis=2), 6.0)
    v = blocks / np.ldexp(1.0, e.astype(np.int32))[:, :, None]
    table = np.array(FP4_VALUES)
    d = np.abs(np.abs(v)[..., None] - table)
    best = d.min(axis=-1, keepdims=True)
    cand = d == best
    even = cand & (np.arange(8) % 2 == 0)
    mag = np.where(even.any(-1), even.argmax(-1), cand.argmax(-1))
    codes = (mag | np.where((v < 0) & (mag > 0), 8, 0)).reshape(o, i).astype(np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    scale = (e + 127).astype(np.uint8)
    return packed.view(np.int8), scale, dequant_fp4_rows(packed.view(np.int8), scale)


def dequant_fp4_rows(packed_i8, scale_u8):
    p = packed_i8.view(np.uint8)
    codes = np.stack([p & 15, p >> 4], axis=-1).reshape(p.shape[0], -1)
    signed = np.array(FP4_VALUES + tuple(-x for x in FP4_VALUES), dtype=np.float32)[codes]
    s = np.ldexp(1.0, scale_u8.astype(np.int32) - 127).astype(np.float32)
    return torch.from_numpy(signed * np.repeat(s, 32, axis=1))


ST_DTYPES = {"F32": (np.float32, 4), "BF16": (None, 2), "F8_E4M3": (None, 1), "F8_E8M0": (np.uint8, 1),
             "I8": (np.int8, 1), "U8": (np.uint8, 1), "I32": (np.int32, 4), "I64": (np.int64, 8)}


def e8m0_record(u8):
    return "F8_E8M0", list(u8.shape), np.ascontiguousarray(u8).tobytes()


def tensor_record(t):
    """(dtype string, shape, raw little-endian bytes) of a torch tensor or numpy array."""
    if isinstance(t, np.ndarray):
        name = {np.dtype(np.uint8): "U8", np.dtype(np.int8): "I8"}[t.dtype]
        return name, list(t.shape), np.ascontiguousarray(t).tobytes()
    name = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3", torch.int8: "I8",
            torch.int32: "I32", torch.int64: "I64", torch.uint8: "U8"}[t.dtype]
    return name, list(t.shape), t.contiguous().view(torch.uint8).numpy().tobytes()


def write_safetensors(path, records):
    """records: name -> (dtype string, shape, bytes). Plain safetensors, keys sorted."""
    header, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(records):
        dt, shape, raw = records[name]
        assert len(raw) == ST_DTYPES[dt][1] * int(np.prod(shape, dtype=np.int64)), name
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors_raw(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


FP4_RE = re.compile(r"(^|\.)experts\.\d+\.(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
FP8_RE = re.compile(r"(\.(attn|self_attn)\.(wq_a|wq_b|wkv|wo_a|wo_b|q_a_proj|q_b_proj|kv_proj|o_a_proj|o_b_proj)"
                    r"|\.indexer\.(wq_b|q_b_proj)|\.shared_experts\.(w1|w2|w3|gate_proj|up_proj|down_proj))\.weight$")


def quantise_checkpoint(src_dir, cfg):
    """Returns (records of the quantised file, f32 state dict of the dequantised weights, counts)."""
    sd = load_file(os.path.join(src_dir, "model.safetensors"))
    records, deq, n8, n4 = {}, {}, 0, 0
    for k, t in sd.items():
        if FP4_RE.search(k) and t.ndim == 2:
            packed, scale, d = quant_fp4_rows(t)
            records[k], records[k[: -len("weight")] + "scale"] = tensor_record(packed), e8m0_record(scale)
            deq[k], n4 = d, n4 + 1
        elif FP8_RE.search(k) and t.ndim == 2:
            codes, scale, d = quant_fp8_blocks(t)
            records[k], records[k[: -len("weight")] + "scale"] = tensor_record(codes), e8m0_record(scale)
            deq[k], n8 = d, n8 + 1
        else:
            records[k], deq[k] = tensor_record(t.contiguous()), t.contiguous()
    L, E = cfg.num_hidden_layers, cfg.n_routed_experts
    want8 = L * 8 + sum(t == CSA for t in cfg.layer_types)
    if n4 != 3 * L * E or n8 != want8:
        names = sorted(k for k in sd if ".0." in k or "layers.0" in k)
        die(f"quantised {n4} FP4 / {n8} FP8 tensors, expected {3 * L * E} / {want8}; the saved names do not "
            f"follow the per-expert upstream layout this script assumes: {names[:40]}")
    return records, deq, n8, n4


def check_quantised(path, deq):
    raw = read_safetensors_raw(path)
    for k, w in deq.items():
        dt, shape, b = raw[k]
        if dt == "I8":
            sdt, sshape, sb = raw[k[: -len("weight")] + "scale"]
            got = dequant_fp4_rows(np.frombuffer(b, np.int8).reshape(shape),
                                   np.frombuffer(sb, np.uint8).reshape(sshape))
        elif dt == "F8_E4M3":
            sdt, sshape, sb = raw[k[: -len("weight")] + "scale"]
            codes = torch.frombuffer(bytearray(b), dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(shape)
            got = dequant_fp8_blocks(codes, np.frombuffer(sb, np.uint8).reshape(sshape))
        else:
            continue
        assert sdt == "F8_E8M0", (k, sdt)
        if not torch.equal(got, w):
            die(f"{k}: dequantising the written file does not give the reference weights")


# --------------------------------------------------------------------------- one fixture


def save_checkpoint(model, tmp):
    try:
        model.save_pretrained(tmp)
        return "save_pretrained (default: original checkpoint names)"
    except Exception as e:  # noqa: BLE001 - fall back, and say so in the notes
        log(f"  save_pretrained failed ({type(e).__name__}: {e}); retrying with save_original_format=False")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        model.save_pretrained(tmp, save_original_format=False)
        return "save_pretrained(save_original_format=False) (transformers names)"


def build_reference_model(fx, seed, tmp):
    """Builds, randomises, saves and reloads one model. Returns (ref_model, cfg, save_mode, quant)."""
    torch.manual_seed(seed)
    cfg = build_config(fx)
    model = transformers.DeepseekV4ForCausalLM(cfg)
    model.eval()
    check_structure(model, cfg)
    randomise(model, cfg, seed)
    instrument(model)
    probe = [int(t) for t in np.random.default_rng(seed + 1).integers(0, cfg.vocab_size, size=fx["T"])]
    mem_logits = forward_logits(model, probe)
    mode = save_checkpoint(model, tmp)
    quant = None
    if fx.get("quant"):
        records, deq, n8, n4 = quantise_checkpoint(tmp, cfg)
        save_file(deq, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        quant = dict(records=records, deq=deq, n8=n8, n4=n4)
    elif fx["layout"] == "deepseek":
        to_deepseek_layout(os.path.join(tmp, "config.json"), fx)
    ref = load_model(tmp)
    check_structure(ref, ref.config)
    diff = float((forward_logits(ref, probe) - mem_logits).abs().max())
    limit = 1e-5 * float(mem_logits.abs().max())
    if quant is None and diff > limit:
        die(f"{fx['name']}: the reloaded checkpoint differs from the in-memory model by {diff:.3g} "
            f"(layout {fx['layout']}: the config.json rewrite changed semantics?)")
    if quant is None and diff != 0.0:
        log(f"  reload differs from the in-memory model by {diff:.3g}")
    names = sorted(load_file(os.path.join(tmp, "model.safetensors")).keys())
    log(f"  {mode}: {len(names)} tensors; non-layer: {[n for n in names if 'layers.' not in n]}")
    log(f"  layer-1 names: {[n for n in names if re.search(r'(^|[.])layers[.]1[.]', n)]}")
    return ref, cfg, mode, quant


def attempt(fx, seed):
    tmp = tempfile.mkdtemp(prefix=f"v4fx_{fx['name']}_")
    try:
        t0 = time.time()
        ref, cfg, mode, quant = build_reference_model(fx, seed, tmp)
        STATE.hits.clear()
        chosen = choose_tokens(ref, fx, cfg.vocab_size, seed)
        if chosen is None:
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        tokens, st = chosen
        hits = dict(STATE.hits)
        n_csa = sum(t == CSA for t in cfg.layer_types)
        n_moe = sum(t == "moe" for t in cfg.mlp_layer_types)
        if n_csa and not any("Indexer" in k for k in hits):
            die(f"{fx['name']}: the stable top-k was never called by the indexer (hits {hits})")
        if n_moe and not any("TopKRouter" in k for k in hits):
            die(f"{fx['name']}: the stable top-k was never called by the router (hits {hits})")
        if n_csa and st["dsa_rows_selecting"] == 0:
            die(f"{fx['name']}: index_topk never binds (no query has more compressed rows than k)")
        logits = st["logits"]
        maxabs = float(logits.abs().max())
        # Incremental decode through the model's own cache, one token at a time: must match.
        dec, cache_layers = chunked_logits(ref, tokens, [1])
        dec_diff = (dec - logits).abs().amax(dim=-1)
        if float(dec_diff.max()) > DECODE_TOL_REL * maxabs:
            worst = int(dec_diff.argmax())
            die(f"{fx['name']}: incremental decode differs from the one-shot forward by {float(dec_diff.max()):.3g} "
                f"at position {worst} (> {DECODE_TOL_REL} * max|logit|); is every top-k stable?")
        chk, _ = chunked_logits(ref, tokens, fx["chunks"])
        chk_diff = float((chk - logits).abs().max())
        if chk_diff > DECODE_TOL_REL * maxabs:
            log(f"  WARNING {fx['name']}: chunked prefill {fx['chunks']} differs by {chk_diff:.3g}")
        # Greedy through the cache must give the same tokens as the full-forward greedy.
        P = fx["prompt"]
        gc, ids = [], list(tokens[:P])
        with torch.no_grad():
            o = ref(input_ids=torch.tensor([ids]), use_cache=True)
            for step in range(GREEDY_STEPS):
                nxt = int(o.logits[0, -1].argmax())
                gc.append(nxt)
                if step + 1 < GREEDY_STEPS:
                    o = ref(input_ids=torch.tensor([[nxt]]), past_key_values=o.past_key_values, use_cache=True,
                            position_ids=torch.tensor([[P + step]]))
        try:
            l64 = forward_logits(load_model(tmp).to(torch.float64), tokens)
            f64_diff = float((l64 - logits.double()).abs().max())
        except Exception as e:  # noqa: BLE001 - a diagnostic only
            log(f"  float64 re-run failed: {type(e).__name__}: {e}")
            f64_diff = float("nan")
        desc = describe(ref)
        return dict(tokens=tokens, st=st, hits=hits, dec_diff=dec_diff, chk_diff=chk_diff, cache_layers=cache_layers,
                    greedy_cached_same=gc == st["greedy"], f64_diff=f64_diff, desc=desc, mode=mode, quant=quant,
                    tmp=tmp, maxabs=maxabs, cfg=cfg, seconds=time.time() - t0)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_fixture(fx, seed, r, out_root, tried):
    name, tmp, st, cfg = fx["name"], r["tmp"], r["st"], r["cfg"]
    d = os.path.join(out_root, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    for f in ("config.json", "generation_config.json"):
        if os.path.exists(os.path.join(tmp, f)):
            shutil.copy(os.path.join(tmp, f), os.path.join(d, f))
    if r["quant"] is not None:
        q = r["quant"]
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                    "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
        c["expert_dtype"] = "fp4"
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)
            f.write("\n")
        write_safetensors(os.path.join(d, "model.safetensors"), q["records"])
        check_quantised(os.path.join(d, "model.safetensors"), q["deq"])
        weights = (f"{q['n8']} linear weights F8_E4M3 with F8_E8M0 128x128 block scales `<name>.scale` "
                   f"(attention wq_a/wq_b/wkv/wo_a/wo_b, indexer wq_b, shared experts); {q['n4']} routed-expert "
                   f"weights E2M1 packed two per I8 byte (low nibble = even column) with F8_E8M0 scales per 32 "
                   f"columns; everything else F32. References use the dequantised weights (f32, exact). ")
    else:
        shutil.copy(os.path.join(tmp, "model.safetensors"), os.path.join(d, "model.safetensors"))
        weights = ""
    save_file({"logits_f32": st["logits"].contiguous()}, os.path.join(d, "reference.safetensors"),
              metadata={"format": "pt"})
    desc = r["desc"]
    notes = (
        f"transformers {transformers.__version__}, torch {torch.__version__}; DeepseekV4ForCausalLM with random "
        f"weights (seed {seed}), saved by {r['mode']}; config.json layout: {fx['layout']}. {weights}"
        f"References from the reloaded checkpoint, float32 on the CPU, eager attention, with every top-k of "
        f"the modeling module replaced by a stable one (equal scores -> lower position first; calls: {r['hits']}). "
        f"logits_f32: one teacher-forced forward over `tokens` (no cache). greedy_f32: {GREEDY_STEPS} argmax tokens "
        f"after greedy_prompt, each step a full forward, EOS ignored. Tokens repaired {st['repairs']} times until: "
        f"top-2 margin >= {MARGIN_REL} * max|logit| everywhere (teacher forced and greedy); learned-router gaps >= "
        f"{ROUTER_GAP_ABS}; indexer boundary gaps >= {DSA_GAP_REL} relative, exact ties only between rows scoring "
        f"exactly 0 with every head product <= -{ZERO_TIE_COS}*|q||k| ({st['dsa_ties']} such boundary rows, decided "
        f"by the stable rule; {st['dsa_rows_selecting']} query rows where index_topk binds). Rejected seeds: "
        f"{tried}. Incremental decode (one token at a time through the model's cache) vs the one-shot forward: max "
        f"{float(r['dec_diff'].max()):.3g}; chunked prefill {fx['chunks']}: {r['chk_diff']:.3g}; float64 re-run: "
        f"{r['f64_diff']:.3g}.")
    ref = {
        "model_type": "deepseek_v4",
        "seed": seed,
        "tokens": r["tokens"],
        "greedy_prompt": r["tokens"][: fx["prompt"]],
        "greedy_f32": st["greedy"],
        "greedy_cached_same": r["greedy_cached_same"],
        "max_abs_logit_f32": r["maxabs"],
        "min_top2_margin": st["min_margin"],
        "min_router_gap": None if math.isinf(st["router_gap"]) else st["router_gap"],
        "min_indexer_boundary_gap_rel": None if math.isinf(st["dsa_gap"]) else st["dsa_gap"],
        "indexer_exact_zero_ties_at_boundary": st["dsa_ties"],
        "indexer_rows_where_topk_binds": st["dsa_rows_selecting"],
        "stable_topk_calls": r["hits"],
        "decode_vs_forward_max_abs_diff": float(r["dec_diff"].max()),
        "decode_vs_forward_max_abs_diff_per_position": [float(v) for v in r["dec_diff"].tolist()],
        "chunked_prefill_sizes": fx["chunks"],
        "chunked_prefill_max_abs_diff": r["chk_diff"],
        "cache_layer_classes": r["cache_layers"],
        "f64_max_abs_diff": None if math.isnan(r["f64_diff"]) else r["f64_diff"],
        "config_layout": fx["layout"],
        "checkpoint": r["mode"] if r["quant"] is None else "fp8_fp4",
        "layers": desc["layers"],
        "rope": desc["rope"],
        "softmax_scale": desc["softmax_scale"],
        "qk_rope_head_dim": desc["qk_rope_head_dim"],
        "indexer_has_scorer_submodule": desc["indexer_has_scorer_submodule"],
        "shared_expert_swiglu_clamp": desc["shared_expert_swiglu_clamp"],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "notes": notes,
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    return dict(name=name, seed=seed, T=fx["T"], vocab=cfg.vocab_size, maxabs=r["maxabs"], margin=st["min_margin"],
                router=st["router_gap"], dsa=st["dsa_gap"], ties=st["dsa_ties"], dec=float(r["dec_diff"].max()),
                chk=r["chk_diff"], f64=r["f64_diff"], repairs=st["repairs"], rejected=len(tried),
                bytes=sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)),
                clamp=desc["shared_expert_swiglu_clamp"])


def make_fixture(fx, out_root, first_seed):
    tried = []
    for seed in range(first_seed, first_seed + MAX_SEEDS):
        log(f"{fx['name']}: seed {seed}")
        r = attempt(fx, seed)
        if r is None:
            tried.append(seed)
            continue
        try:
            row = write_fixture(fx, seed, r, out_root, tried)
        finally:
            shutil.rmtree(r["tmp"], ignore_errors=True)
        log(f"  accepted seed {seed} ({r['seconds']:.1f} s): {r['st']['repairs']} token repairs, greedy "
            f"{r['st']['greedy']}, decode diff {row['dec']:.3g}, stable top-k calls {r['hits']}")
        return row
    die(f"{fx['name']}: no acceptable seed in {MAX_SEEDS} tries")


# --------------------------------------------------------------------------- --list


def list_mode(only):
    log(f"modeling module: {MOD.__file__}")
    for c in REQUIRED_CLASSES + OPTIONAL_CLASSES:
        log(f"  {c}: {'present' if hasattr(MOD, c) else 'absent'}")
    src = inspect.getsource(MOD)
    log("top-k / sort / argmax call sites in the modeling module (all top-k are patched):")
    for n, line in enumerate(src.splitlines(), 1):
        if re.search(r"\b(topk|sort|argsort|argmax|kthvalue)\s*\(", line):
            log(f"  {n}: {line.strip()}")
    from transformers.activations import ACT2FN
    try:
        act = ACT2FN["sqrtsoftplus"]
        log(f"ACT2FN['sqrtsoftplus']: {inspect.getsource(type(act)).strip()}")
    except Exception as e:  # noqa: BLE001
        log(f"ACT2FN['sqrtsoftplus']: {e}")
    base = transformers.DeepseekV4Config()
    log("DeepseekV4Config() defaults:")
    for k in sorted(config_fields(type(base))):
        log(f"  {k} = {getattr(base, k, '<unset>')!r}")
    log(f"  qk_rope_head_dim (derived) = {getattr(base, 'qk_rope_head_dim', None)!r}")
    for fx in FIXTURES:
        if only and fx["name"] not in only:
            continue
        try:
            list_fixture(fx)
        except Exception as e:  # noqa: BLE001 - list everything that can be listed
            log(f"\n{fx['name']}: FAILED {type(e).__name__}: {e}\n{traceback.format_exc()}")


def list_fixture(fx):
    cfg = build_config(fx)
    log(f"\n{fx['name']}: T {fx['T']}, greedy prompt {fx['prompt']}, layout {fx['layout']}, "
        f"quantised {bool(fx.get('quant'))}")
    for k in ("layer_types", "mlp_layer_types", "compress_rates", "sliding_window", "qk_rope_head_dim",
              "rope_parameters", "index_topk", "hc_mult", "swiglu_limit"):
        log(f"  config.{k} = {getattr(cfg, k)!r}")
    model = transformers.DeepseekV4ForCausalLM(cfg)
    check_structure(model, cfg)
    for n, p in model.named_parameters():
        log(f"  param  {n} {tuple(p.shape)} {p.dtype}")
    for n, b in model.named_buffers():
        log(f"  buffer {n} {tuple(b.shape)} {b.dtype}")
    randomise(model, cfg, 1)
    for k, v in describe(model).items():
        log(f"  {k}: {v}")
    try:
        cache = transformers.DynamicCache(config=cfg)
        log(f"  DynamicCache(config) layers: {[type(layer).__name__ for layer in cache.layers]}")
    except Exception as e:  # noqa: BLE001
        log(f"  DynamicCache(config=cfg) failed: {e}")


# --------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join("tests", "data", "models"))
    ap.add_argument("--only", nargs="*", default=None, help="fixture names to (re)generate")
    ap.add_argument("--list", action="store_true", help="print the config and module facts relied on, then exit")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--log", default=None, help="also write the log to this file")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    log(f"python {sys.version.split()[0]}, transformers {transformers.__version__}, torch {torch.__version__}, "
        f"numpy {np.__version__}")
    names = [fx["name"] for fx in FIXTURES]
    for n in args.only or []:
        if n not in names:
            die(f"--only {n}: no such fixture (have {names})")
    set_module(v4_module())
    install_stable_topk()
    rows, failed = [], []
    try:
        if args.list:
            list_mode(args.only)
            return
        os.makedirs(args.out, exist_ok=True)
        t0 = time.time()
        for i, fx in enumerate(FIXTURES):
            if args.only and fx["name"] not in args.only:
                continue
            t1 = time.time()
            try:
                rows.append(make_fixture(fx, args.out, args.first_seed + 1000 * i))
            except Exception as e:  # noqa: BLE001 - keep going, report every failure at the end
                traceback.print_exc()
                log(f"FAILED {fx['name']}: {type(e).__name__}: {e}")
                failed.append(fx["name"])
            log(f"  ({time.time() - t1:.1f} s)")
        log(f"\n{'fixture':<22} {'seed':>5} {'T':>4} {'vocab':>5} {'max|logit|':>10} {'min margin':>10} "
            f"{'router gap':>10} {'idx gap':>9} {'ties':>4} {'decode':>9} {'chunked':>9} {'f64':>9} {'rep':>4} "
            f"{'rej':>3} {'clamp':>5} {'bytes':>8}")
        for r in rows:
            log(f"{r['name']:<22} {r['seed']:>5} {r['T']:>4} {r['vocab']:>5} {r['maxabs']:>10.4f} {r['margin']:>10.4f} "
                f"{r['router']:>10.2e} {r['dsa']:>9.2e} {r['ties']:>4} {r['dec']:>9.2e} {r['chk']:>9.2e} "
                f"{r['f64']:>9.2e} {r['repairs']:>4} {r['rejected']:>3} {str(r['clamp']):>5} {r['bytes']:>8}")
        log("\nREADME rows (tests/data/models/README.md):")
        for r in rows:
            log(f"| {r['name']} | deepseek_v4 | {r['seed']} | {r['vocab']} | {r['maxabs']:.4g} | {r['margin']:.4g} | "
                f"- | {r['bytes']} | see reference.json notes |")
        log(f"elapsed {time.time() - t0:.1f} s; failed: {failed or 'none'}")
    finally:
        if args.log:
            with open(args.log, "w") as f:
                f.write("\n".join(LOG) + "\n")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
