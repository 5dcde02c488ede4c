"""Local stand-ins for cloud services, speaking their real protocols."""
