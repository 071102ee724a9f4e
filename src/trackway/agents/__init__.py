"""Agents driving trackway: the research loop as MCP tools, behind each agent's identity, budget and cap."""
