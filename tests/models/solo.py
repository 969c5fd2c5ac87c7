"""What the batched runners' tests compare with: a sequence run alone, and a tolerance for it."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from cdsl_struct.models.runner import ModelRunner


def tiny_llama():
    """A tiny random Llama (two layers, grouped key/value heads) on transformers' SDPA attention."""
    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    return model


def solo(model, sequence, keep=1):
    """The logits of the last ``keep`` positions of ``sequence`` run alone."""
    return ModelRunner(model).run(sequence, keep=keep)


def close(a, b):
    return torch.allclose(a, b, atol=1e-4, rtol=1e-4)
