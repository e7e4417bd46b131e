#!/usr/bin/env python3
"""Convert PyTorch / HuggingFace text models' weights to oar state dicts, with inputs and logits.

For each case (a small model of one family of `oar::text::models`) this builds the reference
model with seeded random weights (layer norms get random affine parameters and every parameter
initialized to zero gets random values, so that every weight matters to the logits), runs it in
eval mode on seeded token ids, and writes
    OUT/<case>.safetensors      the weights under oar's names (`oar::Model::load` reads it)
    OUT/<case>.io.safetensors   the inputs (`input`; BERT's masked case adds `token_type_ids` and
                                `attention_mask`, the seq2seq case has `src` and `tgt`) and `logits`
The cases and how their names map onto oar's:
  bert_tiny, bert_tiny_masked  transformers' `BertForSequenceClassification` (GELU is the exact,
      erf, one — `hidden_act="gelu"` — and layer norms use ε = 1e-12, as oar's `BertConfig`).
      `embeddings.LayerNorm` is `embeddings.layer_norm`, `encoder.layer.N` is `encoder.layers.N`
      with `attention.self.{query,key,value}` → `self_attn.{q,k,v}_proj`, `attention.output.dense`
      → `self_attn.out_proj`, `attention.output.LayerNorm` → `norm1`, `intermediate.dense` →
      `linear1`, `output.dense` → `linear2`, `output.LayerNorm` → `norm2`. The masked case pads
      the second sequence; HuggingFace masks padding keys with the dtype's lowest value, oar with
      −10⁴ (PaddleNLP's), which give the same softmax in float32.
  transformer_seq2seq_tiny  `Seq2Seq` below: `torch.nn.Transformer` with embeddings scaled by
      √d_model, sinusoidal position encodings and an output projection, as oar's
      `TransformerSeq2Seq`, padding id 0 masked in every attention and a causal target mask.
      `multihead_attn` (the decoder's cross-attention) is `cross_attn` and each attention's
      `in_proj_weight` / `in_proj_bias` split into `q_proj`, `k_proj` and `v_proj`.
  {lstm,gru}_classifier[_last]_tiny  `RnnClassifier` below: `nn.Embedding`, a bidirectional
      two-layer `nn.LSTM` / `nn.GRU` and `nn.Linear`, pooling the outputs' mean over time or
      (`_last`) the last layer's final hidden states, as oar's `LstmClassifier` /
      `GruClassifier`. oar keeps PyTorch's recurrent names, layout (`[gates · hidden, in]`) and
      gate orders (i, f, g, o and r, z, n).
Every Linear weight is stored [in, out] (oar's layout, Paddle's).

    python3 tools/torch_text_to_oar.py             # the committed fixtures (tests/fixtures/zoo)
    python3 tools/torch_text_to_oar.py --out OUT   # the same cases, into OUT

The Rust test `zoo::committed_torch_text_fixtures_match` reads them. Parameters are written as
float16 values (the reference runs on the same float16-rounded values in float32), which halves
the files; buffers (the seq2seq position encodings) as float32. Needs torch, transformers, numpy
and safetensors.
"""
import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from safetensors.numpy import save_file
from torch import nn
from transformers import BertConfig, BertForSequenceClassification


def position_encoding(length, d):
    """oar's sinusoidal table [length, d]: sin(p / 10000^(2i/d)) at feature 2i, cos at 2i + 1,
    computed in float64 and stored as float32 (as `TransformerSeq2Seq` builds it)."""
    pos = np.arange(length, dtype=np.float64)[:, None]
    i = np.arange(d)
    angle = pos / np.power(10000.0, (i - i % 2) / d)
    table = np.where(i % 2 == 0, np.sin(angle), np.cos(angle))
    return torch.from_numpy(table.astype(np.float32))


class Seq2Seq(nn.Module):
    """oar's `TransformerSeq2Seq` in torch: `dropout(table(ids) · √d + position_encoding[:L])`
    for source and target, `nn.Transformer` (post-norm, ReLU, final encoder and decoder norms)
    with a causal target mask and, for `pad_id`, padding keys masked in every attention, then
    `output`."""

    def __init__(self, src_vocab, tgt_vocab, max_length, pad_id, d_model, nhead, layers, ffn):
        super().__init__()
        self.pad_id = pad_id
        self.src_embedding = nn.Embedding(src_vocab, d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab, d_model)
        self.register_buffer("position_encoding", position_encoding(max_length, d_model))
        self.transformer = nn.Transformer(
            d_model, nhead, layers, layers, ffn, dropout=0.1, batch_first=True
        )
        # The encoder's nested-tensor fast path zeroes the padding positions' memory (which
        # every attention masks anyway); the plain path computes them as oar does.
        self.transformer.encoder.use_nested_tensor = False
        self.output = nn.Linear(d_model, tgt_vocab)

    def embed(self, table, ids):
        scale = math.sqrt(self.position_encoding.shape[1])
        return table(ids) * scale + self.position_encoding[: ids.shape[1]]

    def forward(self, src, tgt):
        t = tgt.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)  # True: not attended
        src_pad, tgt_pad = src == self.pad_id, tgt == self.pad_id
        h = self.transformer(
            self.embed(self.src_embedding, src),
            self.embed(self.tgt_embedding, tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        return self.output(h)


class RnnClassifier(nn.Module):
    """oar's `LstmClassifier` / `GruClassifier` in torch: embedding, a batch-first recurrent
    stack (`lstm` or `gru`) and `fc` on the outputs' mean over time (`pooling="mean"`) or on the
    last layer's final hidden states, forward then backward (`pooling="last"`)."""

    def __init__(self, cell, vocab, embed, hidden, layers, classes, pooling):
        super().__init__()
        self.rnn_name, self.pooling = cell.__name__.lower(), pooling
        self.embedding = nn.Embedding(vocab, embed)
        self.add_module(self.rnn_name, cell(embed, hidden, layers, batch_first=True, bidirectional=True))
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, ids):
        out, h = getattr(self, self.rnn_name)(self.embedding(ids))
        if isinstance(h, tuple):  # an LSTM's (h, c)
            h = h[0]
        pooled = out.mean(1) if self.pooling == "mean" else torch.cat([h[-2], h[-1]], dim=-1)
        return self.fc(pooled)


def bert(**extra):
    """The tiny HuggingFace BERT classifier (initializer_range 0.2 instead of 0.02, so the
    hidden states are not all near zero)."""
    config = BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=3,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        initializer_range=0.2,
        **extra,
    )
    return BertForSequenceClassification(config)


# HuggingFace BERT names → oar's, applied in order to each state-dict key.
BERT_NAMES = [
    (".encoder.layer.", ".encoder.layers."),
    (".attention.self.query.", ".self_attn.q_proj."),
    (".attention.self.key.", ".self_attn.k_proj."),
    (".attention.self.value.", ".self_attn.v_proj."),
    (".attention.output.dense.", ".self_attn.out_proj."),
    (".attention.output.LayerNorm.", ".norm1."),
    (".intermediate.dense.", ".linear1."),
    (".output.dense.", ".linear2."),
    (".output.LayerNorm.", ".norm2."),
    (".embeddings.LayerNorm.", ".embeddings.layer_norm."),
]


def rename(model, names=()):
    """The model's state dict under oar's names and layouts, as float32 numpy arrays: each
    `(old, new)` of `names` replaced in turn, Linear weights transposed to [in, out] and
    MultiheadAttention's packed `in_proj_weight` / `in_proj_bias` split into `q_proj`, `k_proj`
    and `v_proj` (three Linear layers in oar)."""
    linear = {f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().float().numpy()
        if k in linear:
            v = v.T
        for old, new in names:
            k = k.replace(old, new)
        if k.endswith(".in_proj_weight") or k.endswith(".in_proj_bias"):
            prefix, kind = k.rsplit(".in_proj_", 1)
            for name, part in zip(("q_proj", "k_proj", "v_proj"), np.split(v, 3, axis=0)):
                out[f"{prefix}.{name}.{kind}"] = np.ascontiguousarray(part.T if kind == "weight" else part)
            continue
        out[k] = np.ascontiguousarray(v)
    return out


def ids(gen, shape, vocab, low=0):
    """Random token ids in [low, vocab), int64."""
    return torch.randint(low, vocab, shape, generator=gen)


def padded(x, lengths, pad_id=0):
    """`x` with every row `i` past `lengths[i]` set to `pad_id`."""
    keep = torch.arange(x.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    return torch.where(keep, x, torch.full_like(x, pad_id))


@dataclass
class Case:
    """How to build one reference model, make its inputs and run it."""

    build: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], dict]
    run: Callable[[nn.Module, dict], torch.Tensor]
    names: tuple = ()


def bert_masked_inputs(gen):
    """Token ids [2, 12] whose second sequence is padding after 8 tokens (attention mask 0
    there), in two segments of 6 (token types 0 and 1)."""
    x = ids(gen, (2, 12), 64)
    mask = padded(torch.ones_like(x), [12, 8])
    types = (torch.arange(12) >= 6).long().expand(2, 12).contiguous()
    return {"input": x, "token_type_ids": types, "attention_mask": mask}


def run_bert(model, io):
    """HuggingFace's logits, with token types and an attention mask where `io` has them."""
    return model(
        input_ids=io["input"], token_type_ids=io.get("token_type_ids"), attention_mask=io.get("attention_mask")
    ).logits


def run_one(model, io):
    """The logits of a model with one input."""
    return model(io["input"])


def cases():
    """Every committed case, by name."""
    out = {
        "bert_tiny": Case(bert, lambda g: {"input": ids(g, (2, 12), 64)}, run_bert, BERT_NAMES),
        "bert_tiny_masked": Case(bert, bert_masked_inputs, run_bert, BERT_NAMES),
        "transformer_seq2seq_tiny": Case(
            lambda: Seq2Seq(16, 18, 10, 0, d_model=16, nhead=2, layers=2, ffn=32),
            # Every sequence starts with a real token; the second ones are padded (id 0).
            lambda g: {
                "src": padded(ids(g, (2, 7), 16, low=1), [7, 4]),
                "tgt": padded(ids(g, (2, 6), 18, low=1), [6, 3]),
            },
            lambda m, io: m(io["src"], io["tgt"]),
            ((".multihead_attn.", ".cross_attn."),),
        ),
    }
    for cell in (nn.LSTM, nn.GRU):
        for pooling, suffix in (("mean", ""), ("last", "_last")):
            make = lambda cell=cell, pooling=pooling: RnnClassifier(cell, 20, 8, 6, 2, 3, pooling)
            out[f"{cell.__name__.lower()}_classifier{suffix}_tiny"] = Case(
                make, lambda g: {"input": ids(g, (3, 7), 20)}, run_one
            )
    return out


def randomize(model, gen):
    """Random layer-norm parameters (they start as ones and zeros) and random values for every
    other parameter initialized to zero (biases), so that every weight matters to the logits."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)
        for p in model.parameters():
            if not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def convert(name, case, out_dir, seed):
    """Build, randomize, round and run `case` with `seed`; write its two files into `out_dir`."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = case.build().eval()
    randomize(model, gen)
    # Round every parameter to float16 so the file can hold it exactly.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())
    io = case.inputs(gen)
    with torch.no_grad():
        logits = case.run(model, io)
    # Buffers keep their names (the seq2seq position encodings) and stay float32.
    buffers = {k for k, _ in model.named_buffers()}
    weights = {k: v.astype(np.float32 if k in buffers else np.float16) for k, v in rename(model, case.names).items()}
    save_file(weights, os.path.join(out_dir, f"{name}.safetensors"))
    tensors = {k: v.numpy() for k, v in io.items()}
    tensors["logits"] = logits.numpy().astype(np.float32)
    save_file(tensors, os.path.join(out_dir, f"{name}.io.safetensors"))
    params = sum(p.numel() for p in model.parameters())
    print(f"{name}: {params} parameters, output {tuple(logits.shape)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "zoo")
    ap.add_argument("--out", default=default, help="where to write the files (default: the fixtures)")
    ap.add_argument("--only", nargs="*", help="convert only these cases")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for i, (name, case) in enumerate(sorted(cases().items())):
        if args.only and name not in args.only:
            continue
        convert(name, case, args.out, 2000 + i)
    print(f"wrote {os.path.normpath(args.out)} (torch {torch.__version__})", file=sys.stderr)


if __name__ == "__main__":
    main()
