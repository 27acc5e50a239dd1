"""Protocol profiles: every setting that changes a score, and where a command's settings come from.

    profile.py    the profile itself: its sections (AgentConfig's own fields, plus the run's model, backend,
                  task and seeds), the loader (`memagent.sections`), the YAML writer, `open_backend`
    resolve.py    the order every command resolves its settings in: the built-in profile, the model's
                  memagent.json, --profile, the flags (`resolve_model_profile`, `model_profile`); reading and
                  writing memagent.json (`model_agent_settings`, `save_agent_settings`)
    reference.py  `memagent profile from-reference`: the official evaluation protocol read out of a checkout
                  of the official repository
"""
