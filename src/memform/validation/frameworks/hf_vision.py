"""Hugging Face transformers' vision-language models as the ground truth of ``formulas/vision.mf``.

The same measurement as :mod:`.hf` (one warm-up step, then a traced one as the Trainer runs it: the loss
only, ``loss.backward()``, the optimizer step, ``zero_grad(set_to_none=True)``), for a
``Qwen3VLForConditionalGeneration`` built by transformers from a config of its own class, fed a batch
with images: ``pixel_values`` as its processor makes them (one row of channels × temporal_patch ×
patch² values per patch), ``image_grid_thw``, and token ids with ``<|vision_start|>``, one
``<|image_pad|>`` per merged patch and ``<|vision_end|>`` in front of the text. memform reads the
model's own ``config.json`` through ``memform import hf`` (``importers/hf_vision.py``), with the batch's
image size and count as ``--set`` keys (``model.vision.image_size``, ``model.vision.images_per_sample``).

The pixel values are copied inside the traced step, as the Trainer's ``_prepare_inputs`` moves a batch
to the device: the patch embedding keeps that copy for its weight gradient (vision.mf counts it).
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import imported_config
from .hf import HFCase, Step, _bytes
from .tracking import StepSamples, replay_reserved, replayed_figures

#: the special tokens' ids (Qwen3-VL's are 151652, 151653, 151655; here the toy vocabulary's last rows)
VISION_START, VISION_END, IMAGE_PAD = 1020, 1021, 1022


@dataclass(frozen=True)
class VLCase:
    """One vision-language training step (transformers' Qwen3-VL, or Gemma-3 with ``model="gemma3"``: SigLIP
    and its pooling projector): text and vision shapes, images per sample and their edge, batch, attention
    kernel, checkpointing and dtype (as :class:`.hf.HFCase`), and which part is frozen."""

    model: str = "qwen3_vl"
    h: int = 128
    L: int = 2
    heads: int = 8
    kv_heads: int = 4
    head_dim: int = 16
    ffn: int = 352
    vocab: int = 1024
    hv: int = 64
    Lv: int = 3
    heads_v: int = 4
    ffn_v: int = 176
    patch: int = 16
    merge: int = 2
    deepstack: tuple[int, ...] = (0, 1)
    projector: int = 96         # Llama-4: projector_input_dim = projector_output_dim = vision_output_dim
    positions: int = 64
    image: int = 128            # pixels a side: (image / patch)² patches an image
    images: int = 1             # images per sample
    b: int = 2
    s: int = 256
    attn: str = "sdpa"
    gc: bool = False
    dtype: str = "fp32"
    frozen: str = "none"        # model.vision.frozen: none, encoder, all
    device: str = "cpu"
    # PEFT LoRA of this rank on the language model's q_proj and v_proj (PEFT's Llama default; the Qwen3-VL tower's
    # attention is one fused qkv and a proj: no adapter there); get_peft_model freezes everything else, the tower too
    lora_r: int = 0

    def label(self) -> str:
        return (f"hf {self.model} L{self.L} h{self.h} vit{self.Lv}x{self.hv} ds{len(self.deepstack)} "
                f"{self.images}x{self.image}px b{self.b} s{self.s} {self.attn}{' gc' if self.gc else ''} "
                f"{self.dtype}{'' if self.frozen == 'none' else ' frozen-' + self.frozen}"
                f"{f' lora{self.lora_r}[q+v]' if self.lora_r else ''}")

    @property
    def patches(self) -> int:
        return (self.image // self.patch) ** 2

    @property
    def image_tokens(self) -> int:
        return self.patches // self.merge ** 2

    # ---- the model, as transformers configures it ------------------------------------------------
    def hf_config(self) -> Any:
        from transformers import Gemma3Config, Llama4Config, Qwen3VLConfig

        if self.model == "llama4":
            # Llama-4: every second LM layer MoE (4 experts, top-1, a shared one); the ViT's MLP is merge²·hv wide
            # as Llama4VisionMLP2.fc1 reads the shuffled features (intermediate_size = hv / ratio²)
            text = dict(hidden_size=self.h, intermediate_size=self.ffn, intermediate_size_mlp=self.ffn,
                        num_hidden_layers=self.L, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                        head_dim=self.head_dim, vocab_size=self.vocab, max_position_embeddings=4 * self.s,
                        num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
                        attention_chunk_size=self.s, use_qk_norm=False)
            vision = dict(hidden_size=self.hv, intermediate_size=self.ffn_v, num_hidden_layers=self.Lv,
                          num_attention_heads=self.heads_v, image_size=self.image, patch_size=self.patch,
                          pixel_shuffle_ratio=1 / self.merge, projector_input_dim=self.projector,
                          projector_output_dim=self.projector, vision_output_dim=self.projector)
            return Llama4Config(text_config=text, vision_config=vision, image_token_index=IMAGE_PAD,
                                boi_token_index=VISION_START, eoi_token_index=VISION_END, tie_word_embeddings=False)

        if self.model == "gemma3":
            text = dict(hidden_size=self.h, intermediate_size=self.ffn, num_hidden_layers=self.L,
                        num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, head_dim=self.head_dim,
                        vocab_size=self.vocab, max_position_embeddings=4 * self.s, sliding_window=self.s,
                        query_pre_attn_scalar=self.head_dim)
            vision = dict(hidden_size=self.hv, intermediate_size=self.ffn_v, num_hidden_layers=self.Lv,
                          num_attention_heads=self.heads_v, image_size=self.image, patch_size=self.patch,
                          vision_use_head=False)
            return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=self.image_tokens,
                                image_token_index=IMAGE_PAD, boi_token_index=VISION_START,
                                eoi_token_index=VISION_END)

        text = dict(hidden_size=self.h, intermediate_size=self.ffn, num_hidden_layers=self.L,
                    num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, head_dim=self.head_dim,
                    vocab_size=self.vocab, max_position_embeddings=4 * self.s, rope_theta=5_000_000,
                    rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True})
        vision = dict(depth=self.Lv, hidden_size=self.hv, num_heads=self.heads_v, intermediate_size=self.ffn_v,
                      patch_size=self.patch, temporal_patch_size=2, spatial_merge_size=self.merge,
                      out_hidden_size=self.h, in_channels=3, num_position_embeddings=self.positions,
                      deepstack_visual_indexes=list(self.deepstack), hidden_act="gelu_pytorch_tanh")
        return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                             image_token_id=IMAGE_PAD, video_token_id=IMAGE_PAD + 1,
                             vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)

    # ---- memform's side ---------------------------------------------------------------------------
    def overrides(self) -> dict[str, Any]:
        """:class:`.hf.HFCase`'s training set-up (the same fields) plus the vision keys."""
        over: dict[str, Any] = {**HFCase.overrides(self), "model.vision.image_size": self.image,  # type: ignore[arg-type]
                                "model.vision.images_per_sample": self.images, "model.vision.frozen": self.frozen}
        if self.lora_r:   # what memform import hf --adapter sets from the case's LoraConfig
            over.update({"lora.rank": self.lora_r, "lora.q_proj": True, "lora.v_proj": True})
        return over

    def memform_config(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            self.hf_config().save_pretrained(tmp)
            return imported_config("hf", Path(tmp) / "config.json", self.label(), overrides=self.overrides())


def _batch(case: VLCase, device: str) -> dict[str, Any]:
    """Token ids, pixel values and grids of ``case.b`` samples of ``case.images`` images each."""
    import torch

    per_image = [VISION_START] + [IMAGE_PAD] * case.image_tokens + [VISION_END]
    n_text = case.s - case.images * len(per_image)
    if n_text < 1:
        raise ValueError(f"{case.label()}: the image tokens do not fit in s = {case.s}")
    ids = torch.randint(0, VISION_START, (case.b, case.s), device=device)
    ids[:, :case.images * len(per_image)] = torch.tensor(per_image * case.images, device=device)
    labels = ids.clone()
    labels[ids >= VISION_START] = -100            # the special tokens are no targets
    if case.model == "llama4":
        # Llama4Processor: one (3, H, W) tile per image (no extra tiles at the tower's own size)
        pixels = torch.randn(case.b * case.images, 3, case.image, case.image, device=device)
        return {"input_ids": ids, "labels": labels, "pixel_values": pixels}
    if case.model == "gemma3":
        # Gemma3Processor: images as (n, 3, H, W), token_type_ids 1 on the image tokens (their block attends
        # bidirectionally)
        pixels = torch.randn(case.b * case.images, 3, case.image, case.image, device=device)
        return {"input_ids": ids, "labels": labels, "pixel_values": pixels,
                "token_type_ids": (ids == IMAGE_PAD).long()}
    side = case.image // case.patch
    grid = torch.tensor([[1, side, side]] * (case.b * case.images), device=device)
    pixels = torch.randn(case.b * case.images * case.patches, 3 * 2 * case.patch ** 2, device=device)
    # what the processor returns beside the ids: 1 on image tokens, 0 on text (M-RoPE reads it)
    types = (ids == IMAGE_PAD).int()
    return {"input_ids": ids, "labels": labels, "pixel_values": pixels, "image_grid_thw": grid,
            "mm_token_type_ids": types}


def measure(case: VLCase, seed: int = 0) -> Step:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _step(case, seed)
    finally:
        torch.set_num_threads(threads)


def _step(case: VLCase, seed: int) -> Step:
    import torch
    from transformers import Gemma3ForConditionalGeneration, Qwen3VLForConditionalGeneration

    torch.manual_seed(seed)
    dtype = torch.bfloat16 if case.dtype == "bf16" else torch.float32
    from transformers import Llama4ForConditionalGeneration

    cls = {"gemma3": Gemma3ForConditionalGeneration, "llama4": Llama4ForConditionalGeneration}.get(
        case.model, Qwen3VLForConditionalGeneration)
    model = cls._from_config(case.hf_config(), attn_implementation=case.attn, dtype=dtype)
    model.train()
    if case.frozen != "none":
        # what fine-tuning recipes do: requires_grad_(False) on the patch embedding and the ViT blocks
        # (and on the projector too: "all")
        if case.model == "llama4":
            vm = model.vision_model
            frozen = [vm.patch_embedding, vm.layernorm_pre, vm.model]
            projector = [vm.layernorm_post, vm.vision_adapter, model.multi_modal_projector]
            for param in (vm.class_embedding, vm.positional_embedding_vlm):
                param.requires_grad_(False)
        elif case.model == "gemma3":
            siglip = model.model.vision_tower
            siglip = getattr(siglip, "vision_model", siglip)   # SiglipVisionTransformer (transformers 4) or itself
            frozen = [siglip.embeddings, siglip.encoder]
            projector = [siglip.post_layernorm, model.model.multi_modal_projector]
        else:
            visual = model.model.visual
            frozen = [visual.patch_embed, visual.pos_embed, visual.blocks]
            projector = [visual.merger, visual.deepstack_merger_list]
        if case.frozen == "all":
            frozen += projector
        for module in frozen:
            module.requires_grad_(False)
    if case.gc:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if case.lora_r:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=case.lora_r, lora_alpha=2 * case.lora_r, lora_dropout=0.0,
                                                 target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    params = list(model.parameters())
    opt = torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-4)
    batch = _batch(case, case.device)
    pixels = batch.pop("pixel_values")
    autocast = (torch.autocast(case.device, dtype=torch.bfloat16) if case.dtype == "amp-bf16"
                else contextlib.nullcontext())

    def train_step(trace: StepSamples | None) -> None:
        # the Trainer's _prepare_inputs: the batch moved to the device, held by training_step until it returns
        on_device = pixels.to(dtype).clone()
        with autocast:
            loss = model(**batch, pixel_values=on_device).loss
        if trace is not None:
            trace.mark("forward")
        loss.backward()
        if trace is not None:
            trace.mark("backward")
        del on_device

    train_step(None)
    opt.step()
    opt.zero_grad(set_to_none=True)
    states = [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    inputs = [*batch.values(), pixels]
    static = [t.untyped_storage() for t in [*params, *model.buffers(), *states, *inputs]]
    trace = StepSamples(ignore=static)
    with trace.mode:
        train_step(trace)
    trained = [p for p in params if p.requires_grad]
    grads = trace.serials(p.grad for p in trained)
    measured = {"params": _bytes(params), "grads": _bytes(p.grad for p in trained), "optimizer": _bytes(states)}
    act = lambda serial: serial not in grads   # noqa: E731
    measured["activations"] = trace.at(trace.marks["forward"], act)
    measured["comm"] = 0
    replayed = replay_reserved(trace, [*params, *model.buffers(), *inputs], states)
    measured.update(replayed_figures(replayed))
    peak, where = trace.peak(act)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return Step({**measured, "activations_peak": peak}, trace.by_op(where, act, 10), 0.0, {}, replayed)


BASE = VLCase()
#: a tower-heavy step: two 256-pixel images a sample (512 patches through the ViT, 128 LM tokens of 256)
TOWER = replace(BASE, images=2, image=256)
#: Llama-4: 224 px tiles in 14 px patches (256 + a class token through the ViT), pixel shuffle 0.5 to 64 tokens.
#: Its tower's blocks only are compared (tests/test_arch_vision.py): transformers' Llama4TextMoe runs every
#: token through every expert (hidden_states.repeat), which moe.mf does not model, so not the whole step
LLAMA4 = replace(BASE, model="llama4", head_dim=32, heads=4, kv_heads=2, ffn=256, ffn_v=256, patch=14, merge=2,
                 image=224, images=2, deepstack=(), positions=257)
#: Gemma-3: SigLIP at 224 px in 14 px patches (256 patches an image), pooled 4×4 to 16 LM tokens
GEMMA3 = replace(BASE, model="gemma3", head_dim=32, heads=4, kv_heads=2, patch=14, merge=4, image=224, images=2,
                 deepstack=(), positions=256)


def sweep() -> list[VLCase]:
    """The cases of ``bench/validate.py --frameworks`` (``--only qwen3_vl``, ``--only gemma3``)."""
    return [BASE, TOWER, replace(TOWER, attn="eager"), replace(TOWER, gc=True), replace(TOWER, frozen="encoder"),
            replace(TOWER, frozen="all"), replace(TOWER, dtype="bf16"), replace(TOWER, dtype="amp-bf16"),
            replace(TOWER, gc=True, dtype="amp-bf16"), replace(TOWER, deepstack=()), GEMMA3, replace(GEMMA3, frozen="encoder"), replace(GEMMA3, gc=True),
            # LoRA on the language model, the tower frozen by PEFT (model.vision.frozen: all)
            replace(TOWER, frozen="all", lora_r=8, dtype="bf16"),
            replace(TOWER, frozen="all", lora_r=8, dtype="bf16", gc=True)]


def quick_sweep() -> list[VLCase]:
    return [BASE, TOWER, replace(TOWER, frozen="encoder")]
