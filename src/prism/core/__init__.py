"""The paper: head schedules, the decoder and its FLOPs. Imports torch and nothing of the kit above."""
