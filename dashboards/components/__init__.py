"""Figures, controls and data access shared by the dashboard pages."""
