"""The export phase: the served forms' registry (forms), making and checking them (make, openvino), and loading
them for prediction and serving."""
