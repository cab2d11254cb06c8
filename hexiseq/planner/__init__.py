"""(being rewritten)"""
