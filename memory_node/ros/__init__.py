"""rclpy layer: nodes, TF buffer, message conversion, replay, command-line client."""
