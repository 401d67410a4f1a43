"""The export phase: the served forms' registry (registry), making and checking them (make, openvino), and loading
them for prediction and serving (forms)."""
