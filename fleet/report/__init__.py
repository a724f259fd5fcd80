"""Run outputs: results, leaderboard, tables and charts."""
