"""A third-party workflow, "echo": a note on the first chunk (a call of its own kind), then the answer from the note.
Its package registers it: [project.entry-points."memagent.workflows"] echo = "echo_workflow:echo"."""
from memagent.agent.answer import final_answer
from memagent.agent.registry import Answer, Call, Prompt, workflow

NOTE = "Question: {question}\nText: {chunk}\nNote what the text says about the question."
ANSWER = "Question: {question}\nNote: {memory}\nAnswer with \\boxed{{}}."


def window(cfg, options):  # its largest prompt, checked against the model's window before any call
    return [Prompt(NOTE, dict(query=cfg.query_tokens, chunk=cfg.chunk_tokens, output=cfg.answer_tokens),
                   "an echo call", "lower --chunk-tokens")]


@workflow(window=window)
def echo(doc, question, options):
    cfg, head = doc.config, next(doc.chunks(), None)
    reply = yield Call("echo", NOTE.format(question=question, chunk=head.text if head else ""), cfg.answer_tokens)
    note = reply.text.strip()
    reply = yield Call("final", ANSWER.format(question=question, memory=note), cfg.answer_tokens)
    answer, _ = final_answer(reply.text, cfg.answer_protocol, cfg.think)
    reply.keep(reply.text, answer=answer, raw_answer=reply.text)  # the final trace record's fields
    return Answer(answer, reply.text, note, 1)
