"""A third-party backend, "canned": every prompt gets the same reply (where your own server would be called), over
the model's own tokenizer. Its package registers it: [project.entry-points."memagent.backends"] canned = "canned_backend:Canned"."""
from transformers import AutoTokenizer

from memagent.backends.base import Generation


class Canned:  # built as Canned(model, **kwargs): kwargs are the profile's chat_template_kwargs, yarn_factor
    def __init__(self, model, reply="\\boxed{unknown}", **kwargs):
        self.tokenizer = AutoTokenizer.from_pretrained(model)  # memagent cuts chunks and counts budgets with it
        self.max_window = 4096  # the model's context in tokens (None: unknown), checked before any call
        self.reply = reply

    def prompt_length(self, prompt):  # tokens the prompt takes as the model sees it (its chat template included)
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, params):  # one Generation per prompt, in order; at most params.max_new_tokens
        ids = self.tokenizer(self.reply, add_special_tokens=False)["input_ids"][:params.max_new_tokens]
        return [Generation(self.tokenizer.decode(ids), list(ids)) for _ in prompts]
