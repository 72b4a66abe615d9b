from minisgl.models.config import KNOWN_CONFIGS, ModelConfig
from minisgl.models.decoder import DecoderForCausalLM
from minisgl.models.resolve import resolve_model

__all__ = ["KNOWN_CONFIGS", "DecoderForCausalLM", "ModelConfig", "resolve_model"]
