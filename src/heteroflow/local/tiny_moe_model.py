"""Build a tiny MoE-config model with random weights and a locally trained tokenizer (no network).

Run with the vLLM venv's interpreter (it has torch, transformers and tokenizers; the HeteroFlow venv need
not): ``python tiny_moe_model.py OUT_DIR``. Real vLLM ranks on CPU serve it (``docs/engine-builds.md``).

Why this shape: vLLM's fault tolerance refuses a dense model, so the config is Qwen2-MoE; a real MoE forward
across DP ranks fails on CPU (``all_gatherv`` is not implemented there), so ``mlp_only_layers`` names every
layer and each one runs dense. Completions then take about half a second on one core.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CORPUS = [
    "HeteroFlow keeps inference fleets serving through hardware faults.",
    "The controller scales a data parallel group down when a rank dies.",
    "A NodeManager supervises the engines of one pod and reports their status.",
    "The Coordinator routes OpenAI requests to the published endpoints of each instance.",
    "hello world, the quick brown fox jumps over the lazy dog 0123456789",
]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
EOS = "<|endoftext|>"
HIDDEN = 128
LAYERS = 2
MARKER = "heteroflow-tiny-moe.json"


def build(out_dir: Path) -> None:
    """Write config, random weights and tokenizer into ``out_dir``; a finished directory is left as it is."""
    if (out_dir / MARKER).is_file():
        return
    import torch  # type: ignore[import-not-found,unused-ignore]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found,unused-ignore]
    from transformers import (  # type: ignore[import-not-found,unused-ignore]
        PreTrainedTokenizerFast,
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
    )

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = [EOS, "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)

    vocab = fast.vocab_size
    eos = fast.convert_tokens_to_ids(EOS)
    config = Qwen2MoeConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=128,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,  # head_dim 64: the CPU attention kernel refuses head_dim 16
        num_key_value_heads=1,
        num_experts=4,
        num_experts_per_tok=2,
        mlp_only_layers=list(range(LAYERS)),  # MoE config, dense layers: a MoE forward across CPU ranks fails
        max_position_embeddings=512,
        bos_token_id=eos,
        eos_token_id=eos,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = Qwen2MoeForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / MARKER).write_text(json.dumps({"hidden": HIDDEN, "layers": LAYERS, "vocab": vocab}) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_moe_model.py OUT_DIR")
    build(Path(sys.argv[1]))
