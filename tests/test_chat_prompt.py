"""qgpm.chat_prompt: the context and the question read out of chat messages (no model)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qgpm.chat_prompt import MIN_WEAK_CONTEXT_CHARS, escape_template, find_context_block, read_chat

DOCS = [
    "The Millstone Bakery opened in 1990 on Bridge Street. It sells rye bread and honey cake.",
    "The town museum owns the skeleton of a whale. The skeleton was found in 1921 near the old harbor wall.",
    "School classes visit the museum every spring. The guide tells them the story of the storm of 1919.",
]
CONTEXT = "\n\n".join(DOCS)
QUESTION = "In which year was the whale skeleton found?"


def render(parts) -> str:
    """The user message the engine renders from ``parts`` (its template, or the default one)."""
    template = parts.template or "{instruction}\n\n{context}\n\n{question}"
    return template.format(instruction=parts.instruction or "", context="\n\n".join(parts.documents), question=parts.question)


@pytest.mark.parametrize(
    "text, marker, instruction",
    [
        (f"Use the following pieces of context to answer.\n\n{CONTEXT}", "paragraph", "Use the following pieces of context to answer."),
        (f"Answer from the documents.\n----------------\n{CONTEXT}", "rule", "Answer from the documents."),
        (f"Be brief.\nContext:\n{CONTEXT}", "label", "Be brief."),
        (f"Context: {CONTEXT}", "label", ""),
        (f"Answer.\n<context>\n{CONTEXT}\n</context>\nThanks.", "tag", "Answer."),
    ],
)
def test_context_block_markers(text, marker, instruction):
    block = find_context_block(text, with_question=False)
    assert block is not None and block.marker == marker
    assert block.context == CONTEXT
    assert block.instruction == instruction
    assert block.documents() == DOCS


def test_a_document_quoting_the_closing_tag_stays_in_the_context():
    quoting = "The style guide says to end the block with </context> on its own line."
    docs = [DOCS[0], quoting, DOCS[1]]
    text = "Answer from the context.\n<context>\n" + "\n\n".join(docs) + f"\n</context>\nQuestion: {QUESTION}"
    block = find_context_block(text, with_question=True)
    assert block.marker == "tag" and block.documents() == docs and block.question == QUESTION
    parts = read_chat([{"role": "user", "content": text}])
    assert list(parts.documents) == docs and render(parts) == text


def test_an_instruction_naming_the_tag_after_the_block_stays_out_of_the_context():
    text = ("<context>\n" + "\n\n".join(DOCS) + "\n</context>\nAnswer using only the text between <context> and </context>.\n"
            f"Question: {QUESTION}")
    block = find_context_block(text, with_question=True)
    assert block.marker == "tag" and block.documents() == DOCS and block.question == QUESTION


def test_one_message_with_labelled_question_renders_back_exactly():
    text = f"Use the following pieces of context to answer the question at the end.\n\n{CONTEXT}\n\nQuestion: {QUESTION}\nHelpful Answer:"
    parts = read_chat([{"role": "user", "content": text}])
    assert (parts.mode, parts.shape) == ("context", "one_message")
    assert parts.question == QUESTION and list(parts.documents) == DOCS
    assert parts.instruction == "Use the following pieces of context to answer the question at the end."
    assert render(parts) == text
    assert parts.found["question_chars"] == [text.index(QUESTION), text.index(QUESTION) + len(QUESTION)]


def test_system_context_and_question_in_the_last_user_message():
    system = f"You answer questions. Use the retrieved context below.\n\n{CONTEXT}"
    parts = read_chat([{"role": "system", "content": system}, {"role": "user", "content": QUESTION}])
    assert (parts.mode, parts.shape) == ("context", "system_context")
    assert parts.question == QUESTION and list(parts.documents) == DOCS and parts.system is None
    assert parts.instruction == "You answer questions. Use the retrieved context below."
    assert parts.found["context_message"] == 0 and parts.found["question_message"] == 1
    assert render(parts) == f"{system}\n\n{QUESTION}"


def test_question_label_of_a_separate_question_message_stays_in_the_template():
    parts = read_chat([{"role": "user", "content": f"Context:\n{CONTEXT}"}, {"role": "user", "content": f"Question: {QUESTION}"}])
    assert parts.shape == "earlier_message" and parts.question == QUESTION
    assert render(parts).endswith(f"\n\nQuestion: {QUESTION}")


@pytest.mark.parametrize("lead", ["", "  ", "\n\n ", "\t\n"])
def test_a_separate_question_message_is_found_after_leading_blank_lines(lead):
    """The question label is read after any leading whitespace, and question_chars locate the
    question in its message; a label with nothing after it is taken as the question's text."""
    message = f"{lead}Question:  {QUESTION}  "
    parts = read_chat([{"role": "system", "content": f"Context:\n{CONTEXT}"}, {"role": "user", "content": message}])
    assert parts.shape == "system_context" and parts.question == QUESTION
    q0, q1 = parts.found["question_chars"]
    assert message[q0:q1] == QUESTION
    bare = read_chat([{"role": "system", "content": f"Context:\n{CONTEXT}"}, {"role": "user", "content": f"{lead}Question:  "}])
    assert bare.question == "Question:"


def test_history_is_kept_as_conversation_not_context():
    msgs = [
        {"role": "system", "content": f"Use the context to answer.\n\n{CONTEXT}"},
        {"role": "user", "content": "When did the bakery open?"},
        {"role": "assistant", "content": "In 1990."},
        {"role": "user", "content": QUESTION},
    ]
    parts = read_chat(msgs)
    assert parts.shape == "system_context" and parts.question == QUESTION
    assert list(parts.documents) == DOCS, "history must not become context"
    assert parts.instruction.startswith("Conversation so far:\nUser: When did the bakery open?\nAssistant: In 1990.")
    assert parts.found["history_messages"] == 2


def test_plain_chat_stays_plain():
    msgs = [{"role": "system", "content": "You are a helpful assistant. Be concise."}, {"role": "user", "content": "Hi, who are you?"}]
    parts = read_chat(msgs)
    assert parts.mode == "plain" and "no context" in parts.reason
    assert [m["role"] for m in parts.messages] == ["system", "user"]


def test_short_system_prompt_after_a_blank_line_is_not_context():
    system = "You answer from the documents the user gives.\n\nBe concise."
    assert find_context_block(system, with_question=False) is None
    assert read_chat([{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]).mode == "plain"


def test_weak_marker_needs_a_long_enough_block():
    short = "x" * (MIN_WEAK_CONTEXT_CHARS - 1)
    head = "Use the context below. " * 20
    assert find_context_block(f"{head}\n\n{short}", with_question=False) is None
    assert find_context_block(f"{head}\n\n{short}xx", with_question=False) is not None


def test_empty_context_block_is_empty_context():
    parts = read_chat([{"role": "system", "content": "Use the following pieces of retrieved context.\n\n"},
                       {"role": "user", "content": QUESTION}])
    assert parts.mode == "empty_context" and parts.question == QUESTION


def test_instruction_text_is_never_the_question():
    text = f"Answer the question using the context. What matters is the text.\n\nContext:\n{CONTEXT}\n\nQuestion: {QUESTION}"
    parts = read_chat([{"role": "user", "content": text}])
    assert parts.question == QUESTION
    # without a question after the context the message is not read as one-message RAG
    assert find_context_block(f"Answer the question using the context?\n\nContext:\n{CONTEXT}", with_question=True) is None


def test_braces_in_the_prompt_are_kept():
    text = f"Use the context {{verbatim}}.\n\nContext:\n{CONTEXT}\n\nQuestion: {QUESTION}\nAnswer {{short}}:"
    parts = read_chat([{"role": "user", "content": text}])
    assert render(parts) == text


def test_marked_blocks_and_kwargs_take_precedence():
    marked = [{"type": "text", "text": "Read."}, {"type": "text", "text": DOCS[0], "qgpm_role": "context"},
              {"type": "text", "text": QUESTION, "qgpm_role": "question"}]
    parts = read_chat([{"role": "system", "content": f"Context:\n{CONTEXT}"}, {"role": "user", "content": marked}])
    assert parts.shape == "marked" and list(parts.documents) == DOCS[:1] and parts.instruction == "Read."
    parts = read_chat([{"role": "user", "content": f"Context:\n{CONTEXT}\n\nQuestion: {QUESTION}"}], context=["Other."])
    assert parts.shape == "kwargs" and list(parts.documents) == ["Other."]


def test_non_text_block_raises():
    with pytest.raises(ValueError, match="text only"):
        read_chat([{"role": "user", "content": [{"type": "image", "url": "x"}]}])
    with pytest.raises(ValueError, match="no messages"):
        read_chat([])


_words = st.text(alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters=" .,'{}"), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    head=_words,
    docs=st.lists(_words.filter(lambda s: s.strip()), min_size=1, max_size=4),
    question=_words.filter(lambda s: s.strip()),
    label=st.sampled_from(["Context:\n", "Documents:\n", "<context>\n"]),
)
def test_found_parts_render_the_message_back(head, docs, question, label):
    """Whatever is found, the engine's template renders the original message text exactly."""
    text = f"{head.strip() or 'Read'}\n{label}" + "\n\n".join(d.strip() for d in docs) + f"\n\nQuestion: {question.strip()}"
    parts = read_chat([{"role": "user", "content": text}])
    assert parts.mode == "context" and parts.question == question.strip()
    assert render(parts) == text


# ----------------------------------------------------------------------------- LangChain's own RAG prompts


def test_the_lcel_cookbook_prompt_keeps_every_document():
    """LangChain's LCEL RAG template puts the context right after a line that ends in 'context:';
    the first blank line between documents is not where the context starts."""
    template = "Answer the question based only on the following context:\n{context}\n\nQuestion: {question}\n"
    for docs in (DOCS[1:], DOCS, DOCS * 2):
        text = template.format(context="\n\n".join(docs), question=QUESTION)
        parts = read_chat([{"role": "user", "content": text}])
        assert (parts.mode, parts.shape) == ("context", "one_message") and list(parts.documents) == docs
        assert parts.question == QUESTION and render(parts) == text


def test_an_inline_context_label_in_a_system_prompt():
    """create_retrieval_chain's documented system prompt ends '... concise. Context: {context}'."""
    system = "Use the given context to answer the question. If you don't know the answer, say you don't know. Context: " + CONTEXT
    parts = read_chat([{"role": "system", "content": system}, {"role": "user", "content": QUESTION}])
    assert (parts.mode, parts.shape) == ("context", "system_context") and list(parts.documents) == DOCS
    assert parts.question == QUESTION


def test_a_document_that_mentions_a_label_after_the_first_blank_line_is_not_a_marker():
    text = f"Use the context below to answer.\n\n{DOCS[0]} Background: the bakery burned in 1950.\n\n{DOCS[1]}\n\nQuestion: {QUESTION}"
    parts = read_chat([{"role": "user", "content": text}])
    assert parts.documents[0].startswith("The Millstone Bakery") and len(parts.documents) == 2


def test_the_rag_tutorial_prompt_with_its_question_before_the_context():
    """rlm/rag-prompt asks 'Question: ... Context: ... Answer:': the context and the question are
    found, and the prompt renders with the labelled question moved after the context (QGPM reads
    relevance from a question that comes last); every other character stays."""
    head = ("You are an assistant for question-answering tasks. Use the following pieces of retrieved context to answer the "
            "question. If you don't know the answer, just say that you don't know. Use three sentences maximum and keep the "
            "answer concise.")
    text = f"{head}\nQuestion: {QUESTION} \nContext: {CONTEXT} \nAnswer:"
    parts = read_chat([{"role": "user", "content": text}])
    assert (parts.mode, parts.shape) == ("context", "one_message") and list(parts.documents) == DOCS
    assert parts.question == QUESTION and parts.instruction == head
    assert render(parts) == f"{head}\nContext: {CONTEXT} \nQuestion: {QUESTION} \nAnswer:"


FAQ = ["Q: When does the depot open?\nA: At six in the morning.", "Q: Where is the spare key?\nA: In the blue cabinet.",
       "Trucks leave the yard at nine."]
ASK = "What time do trucks leave?"


@pytest.mark.parametrize("text", [
    "<documents>\n{c}\n</documents>\n\nAnswer this question: {q}",  # the question after the tags: a "Q:" inside them is a document's
    "Use the context below.\n\nContext:\n{c}\n\n{q}",  # an answered "Q:" line is an FAQ entry, not the prompt's question
])
def test_a_question_label_inside_the_documents_is_not_the_question(text):
    parts = read_chat([{"role": "user", "content": text.format(c="\n\n".join(FAQ), q=ASK)}])
    assert parts.mode == "context" and list(parts.documents) == FAQ
    assert parts.question.endswith(ASK) and "Q:" not in parts.question and "</documents>" not in parts.question
    assert render(parts) == text.format(c="\n\n".join(FAQ), q=ASK)


@pytest.mark.parametrize("sep", ["\n", "\n\n"])
def test_a_message_that_starts_with_its_question_label(sep):
    text = f"Question: {QUESTION}{sep}Context: {CONTEXT}{sep}Answer:"
    parts = read_chat([{"role": "user", "content": text}])
    assert (parts.mode, parts.question, list(parts.documents)) == ("context", QUESTION, DOCS)


def test_a_labelled_question_of_several_paragraphs_stays_whole():
    question = "My situation: the skeleton was moved twice.\n\nIn which year was it found?"
    parts = read_chat([{"role": "user", "content": f"Context:\n{CONTEXT}\n\nQuestion: {question}"}])
    assert parts.question == question and list(parts.documents) == DOCS


def test_a_labelled_line_inside_tags_never_ends_the_context():
    docs = ["Input: two crates of rye flour, logged at the gate.", "Trucks leave the yard at nine."]
    text = "<context>\n{c}\n</context>\n\n{q}".format(c="\n\n".join(docs), q=ASK)
    parts = read_chat([{"role": "user", "content": text}])
    assert parts.mode == "context" and list(parts.documents) == docs and parts.question == ASK



def test_a_context_between_two_equal_rule_lines_ends_at_the_second():
    rule = "---------------------"
    text = (f"Context information is below.\n{rule}\n{CONTEXT}\n{rule}\n"
            f"Given the context information and not prior knowledge, answer the query.\nQuery: {QUESTION}\nAnswer: ")
    block = find_context_block(text, with_question=True)
    assert block.marker == "rule" and block.documents() == DOCS and block.question == QUESTION
    parts = read_chat([{"role": "user", "content": text}])
    assert list(parts.documents) == DOCS and render(parts) == text


def test_a_rule_line_inside_a_document_does_not_close_the_context():
    """A Markdown rule inside a document, with more documents after it, is the document's."""
    docs = ["Kettle FAQ\n---\nThe X200 kettle boils a litre in three minutes.", DOCS[1], DOCS[2]]
    text = "Use the documents below.\n---\n" + "\n\n".join(docs) + f"\n\nQuestion: {QUESTION}"
    block = find_context_block(text, with_question=True)
    assert block.marker == "rule" and block.context == "\n\n".join(docs) and block.question == QUESTION
    parts = read_chat([{"role": "user", "content": text}])
    assert render(parts) == text


@pytest.mark.parametrize("label", ["Question:\n", "**Question:**\n", "Question:\n\n"])
def test_a_question_label_on_a_line_of_its_own_keeps_its_line_break(label):
    one = f"Context:\n{CONTEXT}\n\n{label}{QUESTION}"
    parts = read_chat([{"role": "user", "content": one}])
    assert parts.question == QUESTION and list(parts.documents) == DOCS and render(parts) == one
    system = f"Answer from the context.\n\nContext:\n{CONTEXT}"
    two = read_chat([{"role": "system", "content": system}, {"role": "user", "content": f"{label}{QUESTION}"}])
    assert two.question == QUESTION and two.template.endswith(escape_template(label) + "{question}")


@pytest.mark.parametrize("context_heading, question_heading", [("## Context", "## Question"), ("### Retrieved documents", "### User question"),
                                                                ("# Documents", "# Query")])
def test_markdown_headings_without_a_colon_mark_the_context_and_the_question(context_heading, question_heading):
    text = f"Answer from the context.\n\n{context_heading}\n{CONTEXT}\n\n{question_heading}\n{QUESTION}"
    parts = read_chat([{"role": "user", "content": text}])
    assert list(parts.documents) == DOCS and parts.question == QUESTION and render(parts) == text
    system = read_chat([{"role": "system", "content": f"Answer from the context.\n\n{context_heading}\n{CONTEXT}"},
                        {"role": "user", "content": QUESTION}])
    assert system.shape == "system_context" and list(system.documents) == DOCS


@pytest.mark.parametrize(
    "text, docs, question",
    [
        ("Answer from the context.\n\nContext:\n## Query\nSELECT name FROM users;\n\nThe table users has 3 rows.\n\nWhat does the query return?",
         ["## Query\nSELECT name FROM users;", "The table users has 3 rows."], "What does the query return?"),
        ("Use the following pieces of context to answer.\n\n# Solar panels\nPanels turn light into power on the roof.\n\n## Background\n"
         "Panels were first sold in 1954.\n\nQuestion: When were panels first sold?",
         ["# Solar panels\nPanels turn light into power on the roof.", "## Background\nPanels were first sold in 1954."],
         "When were panels first sold?"),
    ],
)
def test_headings_inside_the_documents_stay_document_text(text, docs, question):
    parts = read_chat([{"role": "user", "content": text}])
    assert list(parts.documents) == docs and parts.question == question and render(parts) == text


def test_a_rule_line_inside_the_last_document_does_not_close_the_context():
    text = ("Use the context below.\n---\nThe ferry leaves at nine.\n\nThe harbour log starts here.\n---\n"
            "The log's key fact is 42.\nQuery: What is the log's key fact?")
    block = find_context_block(text, with_question=True)
    assert block.context.endswith("The log's key fact is 42.") and block.question == "What is the log's key fact?"


@pytest.mark.parametrize("after", [f"{QUESTION}", f"Answer the question: {QUESTION}", f"Answer in one sentence.\n{QUESTION}\nAnswer:",
                                   f"{QUESTION}\nAnswer in one word.", f"\n{QUESTION}\n\nAnswer only from the context. If unsure, say so."])
def test_a_question_on_the_line_after_the_closing_tag_leaves_the_last_document_whole(after):
    docs = [DOCS[0], DOCS[1], "The coastguard cottages are now holiday lets."]
    text = "Use the context to answer.\n<context>\n" + "\n\n".join(docs) + "\n</context>\n" + after
    block = find_context_block(text, with_question=True)
    assert block.marker == "tag" and block.documents() == docs and block.question == QUESTION
    parts = read_chat([{"role": "user", "content": text}])
    assert list(parts.documents) == docs and parts.question == QUESTION and render(parts) == text


@pytest.mark.parametrize("after", ["Please summarize the documents.", "Answer in one word.\nBe brief.", "Is it A?\nOr is it B?"])
def test_after_a_closing_tag_a_line_that_asks_nothing_or_two_that_ask_are_no_question(after):
    text = "<context>\n" + CONTEXT + "\n</context>\n" + after
    assert find_context_block(text, with_question=True) is None  # as before: no question read, the call is plain chat


@pytest.mark.parametrize("line, question", [("Regarding the skeleton: when was it found?", "Regarding the skeleton: when was it found?"),
                                            ("At 10: 30 what happened?", "At 10: 30 what happened?"),
                                            ("Now tell me: " + QUESTION, QUESTION), ("My question: " + QUESTION, QUESTION)])
def test_only_a_lead_in_that_asks_is_cut_off_the_question(line, question):
    text = "<context>\n" + CONTEXT + "\n</context>\n" + line
    assert find_context_block(text, with_question=True).question == question


def test_a_led_question_line_right_after_the_last_document_is_the_question():
    text = f"Use the context below.\nContext:\n{CONTEXT}\nNow tell me: {QUESTION}"
    parts = read_chat([{"role": "user", "content": text}])
    assert list(parts.documents) == DOCS and parts.question == QUESTION and render(parts) == text


def test_a_question_glued_to_the_last_document_is_read_as_one_paragraph_and_said(caplog):
    import qgpm.log

    qgpm.log._WARNED.clear()
    text = f"Use the context below.\nContext:\n{CONTEXT}\n{QUESTION}"
    with caplog.at_level("WARNING", logger="qgpm"):
        parts = read_chat([{"role": "user", "content": text}])
    assert parts.question == f"{DOCS[2]}\n{QUESTION}" and list(parts.documents) == DOCS[:2]
    assert "put a blank line or a 'Question:' label before the question" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="qgpm"):
        read_chat([{"role": "user", "content": f"Use the context below.\nContext:\n{CONTEXT}\nWhere is the museum?"}])  # said once
        assert read_chat([{"role": "user", "content": "Hi there.\n\nQuick one,\nis it sunny?"}]).mode == "plain"  # no context
        two_lines = f"Use the context below.\nContext:\n{CONTEXT}\n\nQuestion: I saw a whale.\nWhen was it found?"  # labelled
        assert read_chat([{"role": "user", "content": two_lines}]).question == "I saw a whale.\nWhen was it found?"
    assert "last paragraph" not in caplog.text


def test_a_documents_source_line_is_not_the_context_label():
    docs = ["Source: a.pdf\n" + DOCS[0], "Source: b.pdf\n" + DOCS[1], "Reference: town records\n" + DOCS[2]]
    text = "Use the retrieved context below to answer.\n\n" + "\n\n".join(docs) + f"\n\nQuestion: {QUESTION}"
    parts = read_chat([{"role": "user", "content": text}])
    assert list(parts.documents) == docs and parts.instruction == "Use the retrieved context below to answer." and render(parts) == text
    labelled = "Sources:\n" + "\n\n".join(docs) + f"\n\nQuestion: {QUESTION}"  # a label line of its own still opens the context
    assert list(read_chat([{"role": "user", "content": labelled}]).documents) == docs
