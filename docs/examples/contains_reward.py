"""A third-party outcome reward, "contains": 1.0 when a gold answer appears in the final reply (case and spacing
aside), else 0.0. Its package registers it: [project.entry-points."memagent.rewards"] contains = "contains_reward:Contains"."""


def norm(text):
    return " ".join((text or "").lower().split())


class Contains:  # built as Contains(**options); a reward of options would take them in __init__
    name, kind = "contains", "outcome"  # an outcome reward scores the final reply; a step reward each update

    def score(self, items):  # items: memagent.rewards.protocol.Answered(question, reply, answers), one batch
        return [float(any(norm(a) in norm(it.reply) for a in it.answers)) for it in items]
