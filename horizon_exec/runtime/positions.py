"""What attention needs besides weights and activations: RoPE tables at each token's position,
each block's sliding window, and, under document masks (Policy.doc_masks), which document each
token belongs to.

Without document masks every sequence has positions 0..T-1: one (T, hd) table pair serves all
rows. With them, positions restart at each document (transformers' packed sequences: what
position_ids with resets mean there), so the step gathers a (batch, 1, T, hd) pair from the
table once, and the block masks attention across documents (layers.attention_mask).
"""
import torch

from horizon_exec.model.rope import rope_tables_per_base
from horizon_sim.errors import HorizonError


def check_docs(docs: torch.Tensor, shape) -> torch.Tensor:
    """docs (B, T) int: a document index per token, non-decreasing along each row (documents
    are contiguous). Returns it as int64 on the host."""
    if tuple(docs.shape) != tuple(shape):
        raise HorizonError(f"docs have shape {tuple(docs.shape)}; tokens have {tuple(shape)}")
    if docs.dtype.is_floating_point or docs.dtype == torch.bool:
        raise HorizonError(f"docs must be integer document indices, got {docs.dtype}")
    docs = docs.to(torch.int64).cpu().contiguous()
    if docs.numel() and bool((docs[:, 1:] < docs[:, :-1]).any()):
        raise HorizonError("docs must not decrease along a sequence (each document is one contiguous run)")
    return docs


def doc_positions(docs: torch.Tensor) -> torch.Tensor:
    """(B, T) int64: each token's offset from the start of its document within the row."""
    B, T = docs.shape
    t = torch.arange(T).expand(B, T)
    start = torch.ones_like(docs, dtype=torch.bool)
    start[:, 1:] = docs[:, 1:] != docs[:, :-1]
    first = torch.where(start, t, 0).cummax(dim=1).values       # (B, T) index of the doc's first token
    return t - first


class AttentionInputs:
    """The executor's per-step attention inputs: the Schedule's device constants (its
    ROPE_*, DOCS and POSITIONS buffers), filled here."""

    def __init__(self, model, policy, buffers, backend):
        from horizon_sim.schedule.op import Holds
        self.m, self.p, self.backend = model, policy, backend
        T = policy.seq
        rs = model.rope_scaling
        if policy.doc_masks and rs is not None and rs.kind == "dynamic" and T > model.max_position:
            # transformers rescales dynamic RoPE by each batch's largest position, which
            # document masks make depend on the data: one table could not match it.
            raise HorizonError(f"dynamic RoPE past max_position_embeddings ({model.max_position}) with "
                               f"document masks is not supported; use --seq <= {model.max_position}")
        if policy.doc_masks and rs is not None and rs.kind == "longrope" and T > rs.original_max_position:
            # the same for longrope's choice of factors: by the batch's longest document there
            raise HorizonError(f"longrope RoPE past its original_max_position_embeddings "
                               f"({rs.original_max_position}) with document masks is not supported; use "
                               f"--seq <= {rs.original_max_position}")
        # one (T, hd) pair per RoPE base (ModelSpec.rope_table_count; stacked when two: Gemma 3)
        self.cos, self.sin = self._per_base(buffers.find(Holds.ROPE_COS)), self._per_base(buffers.find(Holds.ROPE_SIN))
        for c, s, (cos, sin) in zip(self.cos, self.sin, rope_tables_per_base(model, T, self.cos[0].dtype,
                                                                             self.cos[0].device)):
            c.copy_(cos)  # made where transformers makes them
            s.copy_(sin)
        self.docs = self.pos = self.row_cos = self.row_sin = self.host_pos = None
        if policy.doc_masks:
            self.docs, self.pos = buffers.find(Holds.DOCS), buffers.find(Holds.POSITIONS)
            self.row_cos = self._per_base(buffers.find(Holds.ROPE_COS_ROWS))
            self.row_sin = self._per_base(buffers.find(Holds.ROPE_SIN_ROWS))

    def _per_base(self, t) -> list:
        return [t] if self.m.rope_table_count == 1 else list(t.unbind(0))

    def begin_step(self, docs: torch.Tensor | None) -> None:
        """docs (B, T) int64 on the host (checked), or None: one document per sequence. Only
        under document masks; the tables are gathered here, on the calling thread, before any
        lane runs (the engine synchronizes at step start)."""
        if self.docs is None:
            if docs is not None:
                raise HorizonError("docs were given but the policy has doc_masks off")
            return
        if docs is None:
            docs = torch.zeros(self.p.batch, self.p.seq, dtype=torch.int64)
        self.backend.h2d(self.docs, docs)
        self.host_pos = doc_positions(docs)
        self.backend.h2d(self.pos, self.host_pos)
        self.gather(self.pos, self.row_cos, self.row_sin)

    def gather(self, pos, cos_out, sin_out) -> None:
        """cos_out, sin_out [(B, 1, T, hd)] per base <- the tables at positions pos (B, T)."""
        B, T = pos.shape
        for cos, sin, c_out, s_out in zip(self.cos, self.sin, cos_out, sin_out):
            torch.index_select(cos, 0, pos.reshape(-1), out=c_out.view(B * T, -1))
            torch.index_select(sin, 0, pos.reshape(-1), out=s_out.view(B * T, -1))

    def token_positions(self, rows: slice) -> torch.Tensor:
        """(rows, T) int64 on the host: each token's position, restarting per document under
        document masks (the embedding's learned positions, GPT-2's, are looked up at them)."""
        if self.host_pos is not None:
            return self.host_pos[rows]
        n = len(range(*rows.indices(self.p.batch)))
        return torch.arange(self.p.seq).expand(n, self.p.seq)

    def rows(self, rows: slice, layer: int):
        """(cos, sin, window, docs) for block `layer` on the step's sequences `rows`."""
        w, t = self.m.window(layer), self.m.rope_table(layer)
        if self.docs is None:
            return self.cos[t], self.sin[t], w, None
        return self.row_cos[t][rows], self.row_sin[t][rows], w, self.docs[rows]

    def tables(self, docs: torch.Tensor | None):
        """For sequences outside the step (eval), made on the spot: docs (n, T) int64 on the
        host, or None (positions 0..T-1, no document mask). Returns layer -> (cos, sin, window,
        docs), as rows() does."""
        if docs is None:
            cos, sin, d = self.cos, self.sin, None
        else:
            n, T = docs.shape
            cos = [c.new_empty((n, 1, T, c.shape[-1])) for c in self.cos]
            sin = [torch.empty_like(c) for c in cos]
            self.gather(doc_positions(docs).to(self.cos[0].device), cos, sin)
            d = docs.to(self.cos[0].device)
        return lambda layer: (cos[self.m.rope_table(layer)], sin[self.m.rope_table(layer)], self.m.window(layer), d)
