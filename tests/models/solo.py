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


def save_tiny_llama(folder, *, seed=0, heads=2, kv_heads=1):
    """Save a tiny random Llama on SmolLM2's real tokenizer (its vocabulary, its EOS) into ``folder``,
    loadable by name as any model folder; return ``folder`` as a string."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cdsl_struct.models.tokenizers import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True, initializer_range=1.0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
