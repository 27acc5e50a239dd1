"""The prompt templates (memagent.prompts, a base module: AgentConfig's defaults), under the name the agent's
modules and the docs use."""
from memagent.prompts import *  # noqa: F401,F403
from memagent.prompts import __all__  # noqa: F401
