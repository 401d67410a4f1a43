"""Knowledge distillation: the teacher's logits (teacher), the transfer set it labels (transfer), and the student's
loss (loss)."""
