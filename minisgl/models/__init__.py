from minisgl.models.config import KNOWN_CONFIGS, ModelConfig
from minisgl.models.decoder import DecoderForCausalLM

__all__ = ["KNOWN_CONFIGS", "DecoderForCausalLM", "ModelConfig"]
