"""QLoRA as transformers and PEFT run it: the ground truth for ``formulas/finetune.mf``'s 4-bit base.

The model is the :mod:`.hf` case's own transformers model, saved and loaded again the way a QLoRA script
loads a checkpoint: ``from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True,
bnb_4bit_quant_type=..., bnb_4bit_use_double_quant=..., bnb_4bit_compute_dtype=bfloat16))``, which
replaces every decoder ``nn.Linear`` by bitsandbytes' ``Linear4bit`` (integrations/bitsandbytes.py); then
PEFT's ``get_peft_model`` adds the adapters and :mod:`.hf`'s step runs (bitsandbytes' CPU backend runs
``MatMul4Bit`` forward and backward: dequantize, then a dense GEMM). The 4-bit weights are ``Params4bit``
parameters (uint8, two codes per byte); their block constants live in each weight's ``quant_state``
(absmax, and with double quantization the nested ``state2``), counted with the parameters
(:meth:`QLoRACase.kept_tensors`). memform's side is ``memform import hf`` of the saved checkpoint's
``config.json``, whose ``quantization_config`` the importer maps (importers/quant.py), with PEFT's
``adapter_config.json`` (``--adapter``).

``kbit_prep``: the script calls PEFT's ``prepare_model_for_kbit_training`` first (as QLoRA's own scripts
do): every parameter that is not 4-bit -- embeddings, norms, head -- is cast to fp32 (peft/utils/other.py),
so the residual stream and every saved activation are fp32 (Linear4bit casts its input to the compute dtype
and its output back, bitsandbytes nn/modules.py Linear4bit.forward), and with checkpointing on it makes the
embedding's output require a gradient (enable_input_require_grads). memform's side: the same import with
``training.precision.params: fp32`` (the 4-bit weights stay 4-bit: finetune.mf counts them apart).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from . import imported_config
from .hf import BASE, HFCase, Step
from .hf import measure as _measure


@dataclass(frozen=True)
class QLoRACase(HFCase):
    """An :class:`~.hf.HFCase` with LoRA whose base is loaded in 4 bits (bitsandbytes)."""

    dtype: str = "bf16"          # the load dtype of everything not quantized (from_pretrained dtype)
    lora_r: int = 8
    quant_type: str = "nf4"
    double_quant: bool = True
    kbit_prep: bool = False       # PEFT prepare_model_for_kbit_training before get_peft_model
    # bitsandbytes <= 0.43.1's MatMul4Bit saving rule (old_bnb_saving): every 4-bit GEMM keeps its input A
    old_bnb: bool = False
    # the loop holds the previous micro-batch's output until the next forward returns (LitGPT's `logits`)
    keep_last: bool = False
    # the output head in 4 bits too (BitsAndBytesConfig llm_int8_skip_modules=[]: nothing skipped), as Lightning's
    # BitsandbytesPrecision converts every nn.Linear (LitGPT's lm_head included)
    quant_head: bool = False
    # the 4-bit weights' QuantState dtype fp16, as Lightning quantizes an fp16 copy of each weight
    # (fabric/plugins/precision/bitsandbytes.py _Linear4bit.quantize: weight.to(torch.half)): every dequantized
    # weight comes out fp16 and MatMul4Bit casts it to the bf16 compute dtype
    fp16_source: bool = False

    def label(self) -> str:
        # "qlora" marks every case (bench/validate.py --frameworks --only qlora)
        kind = f" qlora-{self.quant_type}{'-dq' if self.double_quant else ''} lora"
        return (super().label().replace(" lora", kind, 1) + (" kbit-prep" if self.kbit_prep else "")
                + (" bnb0.42" if self.old_bnb else "") + (" keep-last" if self.keep_last else "")
                + (" q4-head" if self.quant_head else "") + (" fp16-src" if self.fp16_source else ""))

    def overrides(self) -> dict[str, Any]:
        over = super().overrides()
        if self.kbit_prep:     # every parameter but the 4-bit ones upcast to fp32; the 4-bit GEMMs in bf16
            over.update({"training.precision.params": "fp32", "lora.compute_dtype": "bf16"})
        if self.old_bnb:
            over["lora.bnb_keeps_input"] = True
        if self.keep_last:
            # hf.py's LitGPT loop: the fp32 logits (Fabric convert_output) held with the graph
            over.update({"training.keeps_last_output": True, "training.output_dtype": "fp32",
                         "training.loop_loss_chunk": 128})
        if self.quant_head:
            over["lora.quantize_head"] = True
        if self.fp16_source:
            over["lora.dequant_cast"] = True
        return over

    def quantization_config(self) -> dict[str, Any]:
        """``BitsAndBytesConfig.to_dict()``'s fields that a quantized checkpoint's config.json keeps."""
        return {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                "bnb_4bit_quant_type": self.quant_type, "bnb_4bit_use_double_quant": self.double_quant,
                "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8"}

    def build_model(self, dtype: Any) -> Any:
        import warnings

        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        model = super().build_model(dtype)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            q = self.quantization_config()
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=q["bnb_4bit_quant_type"],
                                     bnb_4bit_use_double_quant=q["bnb_4bit_use_double_quant"],
                                     bnb_4bit_compute_dtype=dtype,
                                     llm_int8_skip_modules=[] if self.quant_head else None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=bnb, dtype=dtype,
                                                             device_map=self.device, attn_implementation=self.attn)
        if self.fp16_source:
            import torch

            for p in model.parameters():
                if getattr(p, "quant_state", None) is not None:
                    p.quant_state.dtype = torch.float16   # what dequantize_4bit allocates its output as
        if self.kbit_prep:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=self.gc)
        return model

    def kept_tensors(self, model: Any) -> list[Any]:
        import torch

        out = []
        for p in model.parameters():
            qs = getattr(p, "quant_state", None)
            while qs is not None:
                out += [t for t in (qs.absmax, qs.code, getattr(qs, "offset", None)) if isinstance(t, torch.Tensor)]
                qs = getattr(qs, "state2", None)
        return out

    def memform_config(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            data = self.hf_config().to_dict()
            data["quantization_config"] = self.quantization_config()
            (Path(tmp) / "config.json").write_text(json.dumps(data))
            self.lora_config().save_pretrained(tmp)
            return imported_config("hf", Path(tmp) / "config.json", self.label(), overrides=self.overrides(),
                                   adapter=str(Path(tmp) / "adapter_config.json"))


@contextlib.contextmanager
def old_bnb_saving(on: bool = True) -> Iterator[None]:
    """bitsandbytes 0.42.0's ``MatMul4Bit.forward`` on the installed bitsandbytes' kernels
    (``bitsandbytes/autograd/_functions.py:514-527`` of 0.42.0): the weight dequantized and cast to the input's
    dtype, then one dense GEMM (``linear(A, dequantize_4bit(B, quant_state).to(A.dtype).t(), bias)``; the
    installed release runs a fused ``gemm_4bit`` instead), and ``ctx.tensors = (A, B)`` when A or B needs a
    gradient, where 0.43.2 on (commit 9e753741, "fix QLoRA mem bug: delete useless buffered activation") stores
    ``(None, B)``; the backward, the installed release's, reads only B either way. Stored on ``ctx`` (not
    ``save_for_backward``), A is not released by the backward: it lives as long as the graph does."""
    if not on:
        yield
        return
    import torch
    from bitsandbytes import functional as F  # noqa: N812 - bitsandbytes' own name
    from bitsandbytes.autograd._functions import MatMul4Bit

    orig = MatMul4Bit.forward

    def forward(ctx, A, B, out=None, bias=None, quant_state=None):  # noqa: ANN001, ANN202, N803
        if A.numel() == 0:
            return orig(ctx, A, B, out, bias, quant_state)
        B = B.view(-1, 1)   # the installed release's canonical packing: dequantize_4bit returns [N, K]
        output = torch.nn.functional.linear(A, F.dequantize_4bit(B, quant_state).to(A.dtype), bias)
        ctx.is_empty = False
        ctx.state = quant_state
        ctx.dtype_A, ctx.dtype_B, ctx.dtype_bias = A.dtype, B.dtype, None if bias is None else bias.dtype
        ctx.tensors = (A, B) if any(ctx.needs_input_grad[:2]) else (None, None)
        return output

    MatMul4Bit.forward = staticmethod(forward)
    try:
        yield
    finally:
        MatMul4Bit.forward = staticmethod(orig)


def measure(case: QLoRACase, seed: int = 0) -> Step:
    """:func:`.hf.measure` of the case (warm-up step, then the traced one; with ``keep_last`` two traced
    micro-batches, the second measured), under bitsandbytes 0.42's saving rule where ``old_bnb``."""
    with old_bnb_saving(case.old_bnb):
        return _measure(case, seed)


Q = QLoRACase(**{k: getattr(BASE, k) for k in ("h", "L", "heads", "kv_heads", "ffn", "vocab", "b", "s")})
#: QLoRA's set-up (NF4, double quantization, adapters on every projection: QLoRA §4 "LoRA on all linear
#: layers"), without double quantization, FP4, PEFT's default targets, checkpointing, a wider MLP
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HEAD_SHAPE = {"h": 512, "ffn": 1024, "heads": 8, "kv_heads": 8, "s": 16, "b": 1, "vocab": 4096}
CASES = [replace(Q, lora_targets=ALL_LINEAR), replace(Q, lora_targets=ALL_LINEAR, double_quant=False),
         replace(Q, quant_type="fp4", double_quant=False), Q, replace(Q, lora_targets=ALL_LINEAR, gc=True),
         replace(Q, lora_targets=ALL_LINEAR, h=256, ffn=1024, heads=8, kv_heads=8, s=128, lora_r=16),
         # a short sequence under wide projections: the dequantized h×f weight (2 MiB) is the backward's
         # largest tensor (finetune.mf decoder.bwd_extra)
         replace(Q, lora_targets=ALL_LINEAR, h=512, ffn=2048, heads=8, kv_heads=8, s=16, b=1, vocab=256),
         # QLoRA's scripts: prepare_model_for_kbit_training (fp32 embeddings, norms, head), with checkpointing
         replace(Q, lora_targets=ALL_LINEAR, kbit_prep=True, gc=True), replace(Q, lora_targets=ALL_LINEAR, kbit_prep=True),
         # a MoE base (formulas/finetune-moe.mf): transformers 5 quantizes q/k/v/o, the fused experts and the
         # router stay bf16 (params were -14.1 % when memform quantized the MLP); PEFT reaches the attention only
         replace(Q, model="mixtral", experts=4, top_k=2, lora_targets=ALL_LINEAR[:4]),
         replace(Q, model="mixtral", experts=4, top_k=2, lora_targets=ALL_LINEAR[:4], kbit_prep=True),
         # bitsandbytes 0.42's MatMul4Bit (old_bnb_saving), as LitGPT 43c44323 pins it (quantize: bnb.nf4, no
         # double quantization, LoRA on q and v): each 4-bit GEMM's input kept (lora.bnb_keeps_input), and
         # under LitGPT's loop (keep_last) the previous micro-batch's kept inputs live through this forward
         # (training.keeps_last_output): finetune.mf keep_last, hf-trainer.mf forward_end
         replace(Q, double_quant=False, old_bnb=True), replace(Q, double_quant=False, old_bnb=True, keep_last=True),
         replace(Q, lora_targets=ALL_LINEAR, L=4, old_bnb=True, keep_last=True),
         # ... with Lightning's 4-bit head (quant_head) and fp16 QuantStates (fp16_source), at a shape whose
         # 4096×512 head outweighs the activations: its dequantized copies (finetune.mf q4_head, q4_cast) are the
         # peak, in the head's forward (0.42's dequantize-then-GEMM) and backward
         replace(Q, double_quant=False, old_bnb=True, keep_last=True, quant_head=True, **HEAD_SHAPE),
         replace(Q, double_quant=False, old_bnb=True, keep_last=True, quant_head=True, fp16_source=True, **HEAD_SHAPE)]


def sweep() -> list[QLoRACase]:
    return CASES


def quick_sweep() -> list[QLoRACase]:
    return CASES[:2]
