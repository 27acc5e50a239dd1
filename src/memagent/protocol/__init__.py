"""Protocol profiles beyond the profile itself: where a command's settings come from.

    resolve.py    the order every command resolves its settings in: the built-in profile, the model's
                  memagent.json, --profile, the flags (`resolve_model_profile`, `model_profile`); reading and
                  writing memagent.json (`model_agent_settings`, `save_agent_settings`)
    reference.py  `memagent profile from-reference`: the official evaluation protocol read out of a checkout
                  of the official repository

The profile (its sections, loader and YAML writer) is `memagent.profile`.
"""
