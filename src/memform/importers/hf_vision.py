"""The vision towers of Hugging Face multimodal configs beyond Qwen2-VL's (``memform import hf``).

``hf._vision`` reads the fields every ViT shares (width, heads, depth, MLP width, patch, channels,
image size); this module reads, per family, what makes its tower differ, into the ``model.vision.*``
keys of ``formulas/vision.mf`` (and ``vision-moe.mf`` for a MoE language model):

- Qwen3-VL / Qwen3-VL-MoE (``qwen3_vl``, ``qwen3_vl_moe``; transformers ``Qwen3VLVisionModel``): a
  Conv3d patch embedding with bias, a learned position table (``num_position_embeddings``, bilinearly
  interpolated), the PatchMerger and one DeepStack merger per ``deepstack_visual_indexes`` entry;
- Gemma-3 (``gemma3``; ``SiglipVisionModel`` + ``Gemma3MultiModalProjector``): SigLIP's Conv2d with bias,
  one position per patch, ``post_layernorm``; the projector average-pools the patch grid down to
  ``mm_tokens_per_image`` tokens, RMS-normalises and projects with one hv×h matrix;
- Llama-4 (``llama4``; ``Llama4VisionModel`` + ``Llama4MultiModalProjector``): an unfold + Linear patch
  embedding without bias, a class token, a position per patch and for the class token, ``layernorm_pre``
  and ``layernorm_post``, the pixel shuffle (``pixel_shuffle_ratio``) and its two-layer MLP, the projector.
"""

from __future__ import annotations

import math

from .draft import Draft, Fields

#: vision_config fields of these families that move no training memory, with the reason
NEUTRAL: dict[str, str] = {
    "norm_eps": "a norm's epsilon",
    "vision_feature_layer": "Llama-4: -1, the last layer's output feeds the projector (read)",
    "vision_feature_select_strategy": "Llama-4: 'default' drops the class token (read)",
    "projector_dropout": "Llama-4's projector dropout: 0 in the released config (read: refused otherwise)",
    "multi_modal_projector_bias": "Llama-4: false in the released config (read: refused otherwise)",
    "vision_output_dim": "Llama-4: = projector_output_dim (read)",
    "projector_output_dim": "Llama-4: = projector_input_dim (read)",
    "projector_input_dim": "read (model.vision.projector_dim)",
}

QWEN3_VL = frozenset({"qwen3_vl", "qwen3_vl_moe"})


def family(model_type: str, vc: Fields) -> str:
    """'qwen3_vl', 'gemma3', 'llama4', or '' (the generic Qwen2-VL / CLIP reading of ``hf._vision``)."""
    vtype = vc.string("model_type", "") if vc.has("model_type") else ""
    if model_type in QWEN3_VL or vtype.startswith("qwen3_vl"):
        return "qwen3_vl"
    if model_type == "gemma3" or (vtype == "siglip_vision_model" and model_type.startswith("gemma3")):
        return "gemma3"
    if model_type == "llama4" or vtype == "llama4_vision_model":
        return "llama4"
    return ""


def read(top: Fields, vc: Fields, draft: Draft, model_type: str, generic) -> None:  # noqa: ANN001 - hf._vision
    """Fill ``model.vision.*`` from ``vision_config``; ``generic`` is ``hf._vision`` (the shared fields)."""
    kind = family(model_type, vc)
    if not kind:
        generic(vc, draft)
        return
    handled: set[str] = set()
    if kind == "qwen3_vl":
        # Qwen3VLVisionPatchEmbed: Conv3d(..., bias=True); Qwen3VLVisionModel.pos_embed: Embedding(npos, hv)
        draft.set("model.vision.patch_bias", True, "Qwen3-VL: the patch Conv3d has a bias")
        draft.set("model.vision.num_positions", vc.integer("num_position_embeddings"),
                  "vision_config.num_position_embeddings (learned, interpolated)")
        layers = vc.raw("deepstack_visual_indexes", [])
        depth = vc.integer("depth")
        if not isinstance(layers, list) or not all(isinstance(i, int) and 0 <= i < depth for i in layers):
            raise vc.error("deepstack_visual_indexes", f"must be a list of ViT layer indices below depth {depth}, "
                                                       f"got {layers!r}")
        if layers:
            draft.set("model.vision.deepstack_layers", len(layers),
                      f"len(vision_config.deepstack_visual_indexes) = len({layers})")
        # Qwen3VLVisionAttention: fused qkv, rotated Q/K copies; sdpa/eager attend per image and torch.cat
        draft.set("model.vision.rope_copies", True, "Qwen3-VL: fused QKV, rotated Q and K kept besides it")
        draft.set("model.vision.attention_concat", True, "Qwen3-VL (sdpa / eager): per-image outputs concatenated")
        handled |= {"deepstack_visual_indexes", "num_position_embeddings"}
    elif kind == "gemma3":
        if vc.raw("vision_use_head", False) not in (False, None):
            raise vc.error("vision_use_head", "is set: SigLIP's attention-pooling head is not used by Gemma-3's "
                                              "projector and is not modelled")
        patch = vc.integer("patch_size", 14)
        image = vc.integer("image_size")
        side = image // patch
        tokens = top.integer("mm_tokens_per_image", 256)
        per_side = math.isqrt(tokens)
        if per_side * per_side != tokens or side % per_side:
            raise top.error("mm_tokens_per_image", f"is {tokens}: Gemma-3's projector pools the {side}×{side} patch "
                                                   f"grid to a square grid that divides it")
        draft.set("model.vision.projector", "gemma3", "Gemma3MultiModalProjector")
        draft.set("model.vision.spatial_merge_size", side // per_side,
                  f"average-pool kernel: {side} patches a side / sqrt(mm_tokens_per_image {tokens})")
        draft.set("model.vision.patch_bias", True, "SigLIP: the patch Conv2d has a bias")
        draft.set("model.vision.num_positions", side * side, "SigLIP: one learned position per patch")
        draft.set("model.vision.post_norm", True, "SigLIP post_layernorm")
        handled |= {"vision_use_head"}
    else:  # llama4
        _llama4(vc, draft)
        handled |= {"num_positions"}
    generic(vc, draft, handled=frozenset(handled), neutral=frozenset(NEUTRAL))


def _llama4(vc: Fields, draft: Draft) -> None:
    ratio = vc.number("pixel_shuffle_ratio", 0.5)
    merge = round(1 / ratio) if ratio > 0 else 0
    if merge < 1 or abs(merge * ratio - 1) > 1e-9:
        raise vc.error("pixel_shuffle_ratio", f"is {ratio}: memform reads the pixel shuffle as 1/ratio × 1/ratio "
                                              f"patches per token (1/ratio a whole number)")
    width = vc.integer("hidden_size")
    pin = vc.integer("projector_input_dim")
    for key in ("projector_output_dim", "vision_output_dim"):
        if vc.integer(key, pin) != pin:
            raise vc.error(key, f"is {vc.integer(key)}, not projector_input_dim {pin}: transformers' Llama4VisionMLP2 "
                                f"and Llama4MultiModalProjector need them equal")
    if vc.has("intermediate_size") and vc.integer("intermediate_size") != merge * merge * width:
        # Llama4VisionMLP2.fc1 = Linear(intermediate_size, ...) takes the shuffled merge²·hv features
        raise vc.error("intermediate_size", f"is {vc.integer('intermediate_size')}, not {merge}² × hidden_size "
                                            f"{width}: Llama4VisionMLP2.fc1 reads the pixel-shuffled features")
    if vc.raw("multi_modal_projector_bias", False) not in (False, None):
        raise vc.error("multi_modal_projector_bias", "is set: memform models Llama-4's projector without a bias "
                                                     "(transformers Llama4MultiModalProjector has none)")
    if vc.number("projector_dropout", 0.0) not in (0, 0.0):
        raise vc.error("projector_dropout", "is set: vision.mf keeps no dropout masks in the projector")
    if vc.raw("vision_feature_layer", -1) != -1:
        raise vc.error("vision_feature_layer", "is not -1: memform's Llama-4 tower feeds the last layer's output")
    patch = vc.integer("patch_size", 14)
    side = vc.integer("image_size") // patch
    draft.set("model.vision.projector", "llama4", "Llama4VisionPixelShuffleMLP + Llama4MultiModalProjector")
    draft.set("model.vision.spatial_merge_size", merge, f"1 / pixel_shuffle_ratio {ratio}")
    draft.set("model.vision.projector_dim", pin, "vision_config.projector_input_dim")
    draft.set("model.vision.class_token", True, "Llama4VisionModel.class_embedding")
    draft.set("model.vision.num_positions", side * side + 1, "positional_embedding_vlm: a row per patch + class")
    draft.set("model.vision.pre_norm", True, "Llama4VisionModel.layernorm_pre")
    draft.set("model.vision.post_norm", True, "Llama4VisionModel.layernorm_post")

