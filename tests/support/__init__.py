"""Helpers the tests share: documents made at test time, real servers, real users, engines."""
