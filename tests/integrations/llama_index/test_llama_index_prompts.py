"""Reading the context and the question back out of the prompts LlamaIndex's synthesizers format (fast, no model)."""

from __future__ import annotations

import pytest

from llama_index.core.prompts import PromptTemplate
from llama_index.core.prompts.chat_prompts import CHAT_REFINE_PROMPT, CHAT_TEXT_QA_PROMPT, CHAT_TREE_SUMMARIZE_PROMPT
from llama_index.core.prompts.default_prompts import (
    DEFAULT_REFINE_PROMPT,
    DEFAULT_SUMMARY_PROMPT,
    DEFAULT_TEXT_QA_PROMPT,
    DEFAULT_TREE_SUMMARIZE_PROMPT,
)

from qgpm_integrations.llama_index import messages_to_prompt
from qgpm_integrations.llama_index._prompt import PromptParts, read_prompt, split_documents

# node texts with the traps of real documents: a label line, a rule line, a question of their own
NODE_A = "Sources: the city archive.\n\nThe Fernside Wing has 36 beds."
NODE_B = "---------------------\nQuery: what is on the second floor?\nThe library."
CONTEXT = NODE_A + "\n\n" + NODE_B
DOCS = ("Sources: the city archive.", "The Fernside Wing has 36 beds.", NODE_B)
QUESTION = "How many beds does the Fernside Wing have?"


@pytest.mark.parametrize("template", [DEFAULT_TEXT_QA_PROMPT, DEFAULT_TREE_SUMMARIZE_PROMPT], ids=["qa", "tree_summarize"])
def test_default_first_step_templates(template):
    parts = read_prompt(template.format(context_str=CONTEXT, query_str=QUESTION))
    assert parts == PromptParts(DOCS, QUESTION, None, "template")
    chat = read_prompt(messages_to_prompt(CHAT_TEXT_QA_PROMPT.format_messages(context_str=CONTEXT, query_str=QUESTION)))
    assert chat == parts  # is_chat_model=True: the chat template, joined by messages_to_prompt


def test_tree_summarize_chat_template():
    text = messages_to_prompt(CHAT_TREE_SUMMARIZE_PROMPT.format_messages(context_str=CONTEXT, query_str=QUESTION))
    assert read_prompt(text) == PromptParts(DOCS, QUESTION, None, "template")


@pytest.mark.parametrize("template", [DEFAULT_REFINE_PROMPT, CHAT_REFINE_PROMPT], ids=["refine", "chat_refine"])
def test_default_refine_templates_give_the_earlier_answer(template):
    values = dict(context_msg=CONTEXT, query_str=QUESTION, existing_answer=" It has 30 beds.\nOr more. ")
    text = template.format(**values) if template is DEFAULT_REFINE_PROMPT else messages_to_prompt(template.format_messages(**values))
    parts = read_prompt(text)
    assert parts == PromptParts(DOCS, QUESTION, "It has 30 beds.\nOr more.", "template")
    assert parts.step == "refine"


def test_a_leading_system_text_is_not_context_and_is_kept():
    text = "You answer briefly.\n\n" + DEFAULT_TEXT_QA_PROMPT.format(context_str="One text.", query_str="Why?")
    assert read_prompt(text) == PromptParts(("One text.",), "Why?", None, "template", "You answer briefly.")
    pirate = "You are a pirate. Start every answer with ARRR.\n" + DEFAULT_TEXT_QA_PROMPT.format(context_str="One text.", query_str="Why?")
    assert read_prompt(pirate).system_text == "You are a pirate. Start every answer with ARRR."
    # LlamaIndex's own default system prompt (the chat templates' first message) is template text
    chat = messages_to_prompt(CHAT_TEXT_QA_PROMPT.format_messages(context_str="One text.", query_str="Why?"))
    assert "expert Q&A system" in chat and read_prompt(chat).system_text is None


def test_a_document_quoting_the_closing_tag_keeps_every_document():
    tagged = PromptTemplate("Answer from the context.\n<context>\n{context_str}\n</context>\nQuestion: {query_str}")
    docs = ("First text.", "Second text quotes </context> in its body.", "Third text.")
    parts = read_prompt(tagged.format(context_str="\n\n".join(docs), query_str="Why?"))
    assert parts == PromptParts(docs, "Why?", None, "shape:tag", "Answer from the context.")


def test_other_templates_are_read_by_the_core_shape_reader():
    # the default's shape in other words: the context ends at the rule line that closes it
    tmpl = PromptTemplate("Notes on the context follow.\n-----\n{context_str}\n-----\nAnswer from the notes only.\nQuestion: {query_str}\nAnswer:")
    parts = read_prompt(tmpl.format(context_str="First text.\n\nSecond text.", query_str="Why?"))
    # the template's instruction and the text between the context and the question are kept for the system message
    assert parts == PromptParts(("First text.", "Second text."), "Why?", None, "shape:rule",
                                "Notes on the context follow.\n\nAnswer from the notes only.")
    labelled = PromptTemplate("Use the documents.\nDocuments:\n{context_str}\n\nQuestion: {query_str}")
    assert read_prompt(labelled.format(context_str="A text.", query_str="What?")) == PromptParts(
        ("A text.",), "What?", None, "shape:label", "Use the documents.")
    tagged = PromptTemplate("<context>\n{context_str}\n</context>\n<question>{query_str}</question>")
    assert read_prompt(tagged.format(context_str="A text.", query_str="What?")) == PromptParts(("A text.",), "What?", None, "shape:tag")


@pytest.mark.parametrize(
    "text",
    [
        PromptTemplate("Rewrite the question: {q}").format(q="Why?"),  # a query transform
        DEFAULT_SUMMARY_PROMPT.format(context_str="A long text."),  # a summary: context, no question
        DEFAULT_TEXT_QA_PROMPT.format(context_str="  \n ", query_str="Why?"),  # no context
        DEFAULT_TEXT_QA_PROMPT.format(context_str="A text.", query_str=" "),  # no question
        "",
    ],
    ids=["query-transform", "summary", "empty-context", "empty-question", "empty"],
)
def test_prompts_without_a_context_and_a_question_are_none(text):
    assert read_prompt(text) is None


def test_split_documents():
    assert split_documents("A.\n\nB.\n \nC.\nD.") == ["A.", "B.", "C.\nD."]
    # simple_summarize formats its context as a Python list of strings
    assert split_documents(str(["A.\n\nB.", "C."])) == ["A.", "B.", "C."]
    assert split_documents("[not a list]") == ["[not a list]"]
