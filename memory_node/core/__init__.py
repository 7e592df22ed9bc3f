"""Pure-Python memory engine: no rclpy imports anywhere below this package."""
