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


def test_a_nodes_metadata_stays_with_its_text():
    """LlamaIndex writes a node's metadata above its text with a blank line between; Reorder and
    Top-K move documents, so the metadata block must be part of the node's document."""
    from llama_index.core.schema import MetadataMode, TextNode

    texts = ["The Fernside Wing has 36 beds.", "The library is on the second floor.\n\nIt opens at nine.", "Note: closed on Sundays."]
    nodes = [TextNode(text=t, metadata={"file_name": f"doc{i}.txt", "page_label": str(i + 1)}) for i, t in enumerate(texts)]
    context = "\n\n".join(n.get_content(metadata_mode=MetadataMode.LLM) for n in nodes)
    parts = read_prompt(DEFAULT_TEXT_QA_PROMPT.format(context_str=context, query_str=QUESTION))
    assert parts.documents == (
        "file_name: doc0.txt\npage_label: 1\n\nThe Fernside Wing has 36 beds.",
        "file_name: doc1.txt\npage_label: 2\n\nThe library is on the second floor.", "It opens at nine.",
        "file_name: doc2.txt\npage_label: 3\n\nNote: closed on Sundays.",
    )
    # look-alikes stay apart: FAQ entries and records (each followed by its own kind), a one-off "Note:" paragraph
    faq = ["Q: When does it open?\nA: At nine.", "Q: Where is it?\nA: Behind the station.", "Q: How many beds?\nA: 36."]
    assert split_documents("\n\n".join(faq)) == faq
    records = ["Name: Fernside Wing\nBeds: 36", "Name: Kingsley\nBeds: 20", "Name: Oak\nBeds: 12"]
    assert split_documents("\n\n".join(records)) == records
    assert split_documents("Text A.\n\nNote: closed on Sundays.\n\nText B.") == ["Text A.", "Note: closed on Sundays.", "Text B."]
    # metadata above FAQ nodes opens them
    nodes = ["file_name: a.txt\n\n" + faq[0], faq[1], "file_name: b.txt\n\n" + faq[2]]
    assert split_documents("\n\n".join(nodes)) == nodes


def test_split_documents():
    assert split_documents("A.\n\nB.\n \nC.\nD.") == ["A.", "B.", "C.\nD."]
    # simple_summarize formats its context as a Python list of strings
    assert split_documents(str(["A.\n\nB.", "C."])) == ["A.", "B.", "C."]
    assert split_documents("[not a list]") == ["[not a list]"]


def _chat_engine_turn(template: str, system_prompt: str, history: list, **values) -> str:
    """One turn of a LlamaIndex chat engine, formatted as its response synthesizer formats it
    for a completion model: the engine's messages joined by messages_to_prompt."""
    from llama_index.core.base.llms.types import MessageRole
    from llama_index.core.chat_engine.utils import get_prefix_messages_with_context
    from llama_index.core.prompts import ChatPromptTemplate

    messages = get_prefix_messages_with_context(PromptTemplate(template), system_prompt, [], history, MessageRole.SYSTEM)
    return messages_to_prompt(ChatPromptTemplate.from_messages(messages).format_messages(**values))


def _chat_engine_templates():
    from llama_index.core.chat_engine import condense_plus_context, context

    return [pytest.param(context.DEFAULT_CONTEXT_TEMPLATE, None, id="context"),
            pytest.param(context.DEFAULT_REFINE_TEMPLATE, "It has 30 beds.", id="context_refine"),
            pytest.param(condense_plus_context.DEFAULT_CONTEXT_PROMPT_TEMPLATE, None, id="condense_plus_context"),
            pytest.param(condense_plus_context.DEFAULT_CONTEXT_REFINE_PROMPT_TEMPLATE, "It has 30 beds.", id="condense_plus_context_refine")]


@pytest.mark.parametrize("template, existing", _chat_engine_templates())
@pytest.mark.parametrize("system_prompt", ["", "Answer in one sentence."])
def test_a_chat_engine_turn_ranks_only_the_retrieved_nodes(template, existing, system_prompt):
    """The chat engines' context templates: the nodes are the documents, the user's message the
    question; the template's own text is no document, and the engine's system prompt and the
    earlier turns (an earlier answer included) go to the system text, never to the documents."""
    from llama_index.core.base.llms.types import ChatMessage, MessageRole

    history = [ChatMessage(role=MessageRole.USER, content="Where is the Fernside Wing?"),
               ChatMessage(role=MessageRole.ASSISTANT, content="The Fernside Wing is at the county hospital.")]
    values = dict(query_str=QUESTION, **({"context_msg": CONTEXT, "existing_answer": existing} if existing else {"context_str": CONTEXT}))
    parts = read_prompt(_chat_engine_turn(template, system_prompt, history, **values))
    assert parts is not None and (parts.documents, parts.question, parts.existing_answer) == (DOCS, QUESTION, existing)
    assert parts.system_text == "\n\n".join(
        p for p in (system_prompt, "Conversation so far:\nUser: Where is the Fernside Wing?\n"
                                   "Assistant: The Fernside Wing is at the county hospital.") if p)
    first_turn = read_prompt(_chat_engine_turn(template, system_prompt, [], **values))
    assert (first_turn.documents, first_turn.question, first_turn.system_text) == (DOCS, QUESTION, system_prompt or None)
