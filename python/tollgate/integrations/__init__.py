"""Adapters for agent frameworks, one module each, imported on demand (each needs its
framework installed): ``tollgate.integrations.langchain`` (LangChain v1 / LangGraph),
``.crewai`` (CrewAI hooks), ``.openai_agents`` (OpenAI Agents SDK guardrails) and
``.autogen`` (AutoGen tools). Every one checks a tool call with a library-mode ``Guard`` or a
daemon-mode ``Client`` before it runs, holds it for a human when Tollgate says HITL, and
settles its cost after it runs."""
