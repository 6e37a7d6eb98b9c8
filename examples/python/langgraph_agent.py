"""A LangChain v1 agent whose every tool call goes through Tollgate (library mode).

Runs offline: the model is a scripted fake. Requires `langchain` and `langgraph`
(`pip install ./python langchain langgraph`).

    python examples/python/langgraph_agent.py
"""

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

import tollgate
from tollgate.integrations.langchain import TollgateMiddleware


@tool
def search(q: str) -> str:
    """Search the web."""
    return f"results for {q}"


@tool
def pay(invoice: str, amount: float) -> str:
    """Pay an invoice."""
    return f"paid {invoice}: ${amount}"


class ScriptedModel(FakeMessagesListChatModel):
    """Answers with the scripted messages in order (a stand-in for a real chat model)."""

    def bind_tools(self, tools, **kwargs):
        return self


def calls(name, *args_list):
    return [AIMessage(content="", tool_calls=[{"name": name, "args": a, "id": f"call_{i}"}])
            for i, a in enumerate(args_list)] + [AIMessage(content="done")]


# 1. A loop: the 4th identical call in a row is denied, and the model reads why.
guard = tollgate.Guard(budget_usd=1.0, max_repeat_calls=3)
agent = create_agent(ScriptedModel(responses=calls("search", *[{"q": "tollgate"}] * 4)), [search],
                     middleware=[TollgateMiddleware(guard, cost=0.01)])
result = agent.invoke({"messages": [("user", "research tollgate")]})
for m in result["messages"]:
    if m.type == "tool":
        print(f"{m.name}: {m.content}")
print(f"budget left: ${guard.budget_remaining_usd:.2f}")

# 2. A payment waits for a human: the graph pauses (LangGraph interrupt) and resumes
#    with the decision; "modify" would carry edited arguments instead.
payments = tollgate.Guard(hitl_mode="always")
agent = create_agent(ScriptedModel(responses=calls("pay", {"invoice": "INV-7", "amount": 120.0})), [pay],
                     middleware=[TollgateMiddleware(payments)], checkpointer=InMemorySaver())
config = {"configurable": {"thread_id": "invoices"}}
result = agent.invoke({"messages": [("user", "pay INV-7")]}, config)
(held,) = result["__interrupt__"]
print(f"held for a human: {held.value['tool']} {held.value['args']} ({held.value['reason']})")
result = agent.invoke(Command(resume={"decision": "approve", "operator": "alice"}), config)
print(f"pay: {[m for m in result['messages'] if m.type == 'tool'][-1].content}")
