"""Agents: user code that talks to the policy through an OpenAI-compatible client or HTTP endpoint.

``spec.py`` (a ``run`` function checked at binding), ``session.py`` (one episode's calls, served by the
engine and recorded with their exact ids) with ``template.py`` (``rollout.chat_template_type``: how a
call's messages become its ids), ``client.py`` (the ``openai``-like clients), ``endpoint.py``
with ``requests.py``, ``openai_types.py`` and ``images.py`` (the HTTP form; images as data URLs),
``tools.py`` and ``tool_parsers.py``,
``trajectory.py`` and ``episodes.py`` (recorded calls -> rows, rewards, errors), ``loop.py`` (the
episodes' watched event loop), ``processes.py`` with ``process_main.py`` (``rollout.agent_processes``: HTTP-form
episodes in processes of their own), ``workflow.py`` (the workflow that runs one agent episode per sample),
``multi_turn.py`` (the built-in "try again" agent as a workflow class, ``MultiTurnWorkflow``).
"""
