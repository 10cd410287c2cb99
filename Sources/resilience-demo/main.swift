print("resilience-demo")
