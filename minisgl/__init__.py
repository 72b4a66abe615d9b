"""minisgl: a small, fast LLM serving engine (and the course that builds it)."""

from minisgl.core import SamplingParams
from minisgl.llm import LLM, RequestOutput

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
