"""The live path: controller + actuator + budget around a running process."""
